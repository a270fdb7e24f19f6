// THE HUGE PAGES (src/model/compute/huge-pages.ts): a kernel memory is advised MADV_HUGEPAGE
// before its first write, seen from the kernel's side (the mapping's VmFlags in
// /proc/self/smaps carry "hg"), and says so; asked not to, it is not advised; the outputs are
// the same bits either way.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { transparentHugePages } from "../../src/model/compute/huge-pages.ts";
import { MatmulKernel } from "../../src/model/compute/matmul.ts";

/** The VmFlags of the mapping holding memory's byte 0, or null where there is no /proc/self/smaps. */
function vmFlagsAt(memory: WebAssembly.Memory): string[] | null {
  if (process.platform !== "linux") return null;
  const { ptr } = require("bun:ffi") as { ptr(v: ArrayBufferView): number };
  const at = BigInt(ptr(new Uint8Array(memory.buffer)));
  let inside = false;
  for (const line of readFileSync("/proc/self/smaps", "utf8").split("\n")) {
    const range = /^([0-9a-f]+)-([0-9a-f]+) /.exec(line);
    if (range) inside = BigInt(`0x${range[1]}`) <= at && at < BigInt(`0x${range[2]}`);
    else if (inside && line.startsWith("VmFlags:")) return line.slice(8).trim().split(/\s+/);
  }
  return null;
}

function kernel(hugePages?: boolean): MatmulKernel {
  const w = new Float32Array(64 * 256).map((_, i) => Math.sin(i) / 8);
  return new MatmulKernel([{ matrix: w, cols: 256 }], hugePages === undefined ? {} : { hugePages });
}

describe("kernel memory on 2 MiB pages", () => {
  test("advised before its first write where the host hands huge pages out, and says so", () => {
    const mm = kernel();
    expect(mm.hugePages).toBe(transparentHugePages() && process.platform === "linux");
    const flags = vmFlagsAt(mm.memory!);
    if (mm.hugePages) expect(flags).toContain("hg");
    mm.close();
  });

  test("hugePages: false leaves it on 4 KiB pages", () => {
    const mm = kernel(false);
    expect(mm.hugePages).toBe(false);
    const flags = vmFlagsAt(mm.memory!);
    if (flags !== null) expect(flags).not.toContain("hg");
    mm.close();
  });

  test("the same bits on either page size", () => {
    const x = new Float32Array(256).map((_, i) => Math.cos(i));
    const outs = [true, false].map((h) => {
      const mm = kernel(h);
      const y = new Float32Array(64);
      mm.matmul(y, x, mm.views[0]!, 0, 1, 256, 64);
      mm.close();
      return y;
    });
    expect(Array.from(outs[0]!)).toEqual(Array.from(outs[1]!));
  });
});
