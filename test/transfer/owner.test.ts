import { expect, test } from "bun:test";
import { KvPool } from "../../src/pool/index.ts";
import { transfer } from "../../src/transfer/index.ts";
import { fakePrefill, fakePrompt } from "../support/fake-model.ts";
import { evictAll, PATHS, prefillTransport, SHAPE, snapshot, startDecode } from "./harness.ts";

// A push names the gateway replica it was asked for (KvChunk.owner, the data plane's OWNER
// frame); D frees that replica's unclaimed handles, and only those, once it is gone.
for (const path of PATHS) {
  test(`${path}: releaseOwner frees the handles of one replica, not another's nor unowned ones`, async () => {
    const d = await startDecode(path);
    const t = prefillTransport(path);
    const P = new KvPool(SHAPE, 64);
    try {
      const base = snapshot(d.pool, d.rx);
      const push = async (owner: string | undefined, salt: number) => {
        const pre = fakePrefill(P, fakePrompt(9, salt))!;
        const h = `h-${path}-${salt}`;
        await transfer(t, d.target, P, h, pre.ids, pre.hashes, undefined, owner);
        return h;
      };
      const [b1, b2] = [await push("gateway-b.1", 1), await push("gateway-b.1", 2)];
      const a = await push("gateway-a.1", 3);
      const none = await push(undefined, 4);
      expect(d.rx.pending()).toBe(4);
      expect(d.rx.releaseOwner("gateway-b.1")).toBe(2);
      expect(d.rx.releaseOwner("gateway-b.1")).toBe(0);
      expect(d.rx.releaseOwner("")).toBe(0);
      expect(d.rx.pending()).toBe(2);
      expect([d.rx.release(b1), d.rx.release(b2), d.rx.release(a), d.rx.release(none)]).toEqual([false, false, true, true]);
      evictAll(d.pool);
      expect(snapshot(d.pool, d.rx)).toEqual(base);
    } finally {
      await t.close();
      await d.close();
    }
  });
}
