import { describe, expect, test } from "bun:test";
import { availableParallelism } from "node:os";
import { loadModel } from "../../src/cli/engine-node.ts";
import { ConfigError, helpText, parseArgs } from "../../src/cli/options.ts";
import { transparentHugePages } from "../../src/model/compute/huge-pages.ts";
import { SYNTHETIC_MODEL_NAME } from "../../src/model/index.ts";

describe("model options", () => {
  test("dtype and threads flags and defaults", () => {
    const d = parseArgs([]).config.engine;
    expect(d.dtype).toBe("as-stored");
    expect(d.threads).toBe(availableParallelism());
    const c = parseArgs(["--dtype", "q8_0", "--threads", "3"]).config.engine;
    expect(c.dtype).toBe("q8_0");
    expect(c.threads).toBe(3);
    expect(() => parseArgs(["--dtype", "f8"])).toThrow(ConfigError);
    expect(() => parseArgs(["--dtype", "f8"])).toThrow(/want one of as-stored, f32, f16, bf16, q8_0/);
    expect(() => parseArgs(["--threads", "0"])).toThrow(/positive integer/);
    expect(helpText()).toContain("--dtype");
    expect(helpText()).toContain("--threads");
  });

  test("load model packs the weights and starts threads", async () => {
    // The synthetic model: f32 as generated (the default tl-kjv-small is stored as f16).
    const m = await loadModel({ modelPath: SYNTHETIC_MODEL_NAME, dtype: "bf16", threads: 2 });
    expect(m.dtype).toBe("bf16");
    expect(m.threads).toBe(2);
    const f32 = await loadModel({ modelPath: SYNTHETIC_MODEL_NAME });
    expect(f32.dtype).toBe("f32");
    // Left out, threads is the option's default (all cores), as --help says; it was 1 here.
    expect(f32.threads).toBe(availableParallelism());
    m.close?.();
    f32.close?.();
  });

  test("model_thread_flag: the model on a thread of its own by default, on the event loop when asked", async () => {
    expect(parseArgs([]).config.engine.model_thread).toBe("worker");
    expect(parseArgs(["--model-thread", "main"]).config.engine.model_thread).toBe("main");
    expect(() => parseArgs(["--model-thread", "gpu"])).toThrow(/want one of worker, main/);
    expect(helpText()).toContain("--model-thread");
    const [worker, main] = await Promise.all(
      (["worker", "main"] as const).map((modelThread) => loadModel({ modelPath: SYNTHETIC_MODEL_NAME, dtype: "bf16", threads: 2, modelThread })),
    );
    // The same model either way: the worker loaded its own copy of the weights.
    for (const k of ["name", "nLayers", "nKvHeads", "headDim", "maxSeqLen", "dtype", "threads", "stats", "eosIds"] as const)
      expect(worker![k]).toEqual(main![k]);
    expect([worker!.sharedSlab, main!.sharedSlab]).toEqual([true, undefined]);
    expect(worker!.runner.logitsBuffer).toBeFunction();
    worker!.close?.();
    main!.close?.();
  });

  test("huge_pages: 2 MiB pages where the host gives them, 4 KiB when turned off, on either model thread", async () => {
    expect(parseArgs([]).config.engine.huge_pages).toBe(true);
    expect(parseArgs(["--huge-pages=false"]).config.engine.huge_pages).toBe(false);
    expect(helpText()).toContain("--huge-pages");
    const models = await Promise.all(
      (["worker", "main"] as const).flatMap((modelThread) =>
        [true, false].map((hugePages) => loadModel({ modelPath: SYNTHETIC_MODEL_NAME, dtype: "bf16", threads: 1, modelThread, hugePages })),
      ),
    );
    const thp = transparentHugePages();
    expect(models.map((m) => m.hugePages)).toEqual([thp, false, thp, false]);
    for (const m of models) m.close?.();
  });
});
