import { describe, expect, test } from "bun:test";
import { crc32c, crc32cBackend, crc32cNative, crc32cNodeRs, crc32cTable } from "../../src/codec/index.ts";
import { crc32cRef, xorshift } from "./support.ts";

const utf8 = (s: string) => new TextEncoder().encode(s);

describe("crc32c", () => {
  test('check value CRC-32C("123456789") = 0xe3069283', () => {
    expect(crc32c(utf8("123456789"))).toBe(0xe3069283);
    expect(crc32cTable(utf8("123456789"))).toBe(0xe3069283);
    expect(crc32cRef(utf8("123456789"))).toBe(0xe3069283);
    expect(crc32c(new Uint8Array(0))).toBe(0);
    expect(crc32cTable(new Uint8Array(0))).toBe(0);
  });

  test("crc32c runs @node-rs/crc32 unless told otherwise", () => {
    // Not aws-crt: its crash handler kills a process whose threads JavaScriptCore suspends.
    if (process.env.TL_CRC32C === undefined) expect(crc32cBackend()).toBe("node-rs");
    expect(crc32cNative()).not.toBeNull();
    expect(crc32cNodeRs()).not.toBeNull();
  });

  test("TL_CRC32C=aws-crt runs aws-crt's binding, with the same values", () => {
    // A process of its own: the choice is made once per process, and aws-crt's handler stays there.
    const script = `import { crc32c, crc32cBackend } from ${JSON.stringify(`${import.meta.dir}/../../src/codec/index.ts`)};
      const b = new Uint8Array(5000).map((_, i) => (i * 131) & 0xff);
      console.log(JSON.stringify([crc32cBackend(), crc32c(new TextEncoder().encode("123456789")), crc32c(b.subarray(3)), crc32c(b.subarray(7, 7 + 61), 0x1234)]));`;
    const r = Bun.spawnSync([process.execPath, "-e", script], { env: { ...process.env, TL_CRC32C: "aws-crt" } });
    expect(r.exitCode).toBe(0);
    const [backend, check, long, seeded] = JSON.parse(r.stdout.toString()) as [string, number, number, number];
    if (process.platform === "linux" && process.arch === "x64") expect(backend).toBe("aws-crt");
    const b = new Uint8Array(5000).map((_, i) => (i * 131) & 0xff);
    expect(check).toBe(0xe3069283);
    expect(long).toBe(crc32cTable(b.subarray(3)));
    expect(seeded).toBe(crc32cTable(b.subarray(7, 7 + 61), 0x1234));
  });

  test("crc fallback equals native", () => {
    const native = crc32cNative()!;
    const nodeRs = crc32cNodeRs()!;
    const rnd = xorshift(42);
    const backing = new Uint8Array(5000 + 16);
    for (let i = 0; i < backing.length; i++) backing[i] = rnd() & 0xff;
    const lengths = [...Array.from({ length: 300 }, (_, i) => i), ...Array.from({ length: 200 }, () => rnd() % 5001), 5000];
    for (const len of lengths) {
      const off = rnd() % 16; // unaligned subarray views
      const view = backing.subarray(off, off + len);
      const want = native(view);
      if (crc32cTable(view) !== want)
        throw new Error(`length ${len} offset ${off}: table 0x${crc32cTable(view).toString(16)} != native 0x${want.toString(16)}`);
      if (nodeRs(view) !== want)
        throw new Error(`length ${len} offset ${off}: @node-rs 0x${nodeRs(view).toString(16)} != ${crc32cBackend()} 0x${want.toString(16)}`);
      expect(crc32c(view)).toBe(want);
    }
    for (const len of [0, 1, 7, 8, 9, 63, 1000]) expect(crc32cTable(backing.subarray(3, 3 + len))).toBe(crc32cRef(backing.subarray(3, 3 + len)));
  });

  test("an initial value continues a previous crc, in both", () => {
    const rnd = xorshift(5);
    const b = new Uint8Array(777).map(() => rnd() & 0xff);
    for (const cut of [0, 1, 100, 776, 777]) {
      const a = b.subarray(0, cut);
      const c = b.subarray(cut);
      expect(crc32cTable(c, crc32cTable(a))).toBe(crc32c(b));
      expect(crc32c(c, crc32c(a))).toBe(crc32c(b));
      expect(crc32cNodeRs()!(c, crc32cNodeRs()!(a))).toBe(crc32c(b));
    }
  });

  test("TL_CRC32C selects a slower implementation", () => {
    for (const want of ["table", "node-rs"]) {
      const r = Bun.spawnSync({
        cmd: [
          process.execPath,
          "-e",
          `import { crc32c, crc32cBackend } from "./src/codec/index.ts"; console.log(crc32cBackend(), crc32c(new TextEncoder().encode("123456789")).toString(16));`,
        ],
        env: { ...process.env, TL_CRC32C: want },
        cwd: `${import.meta.dir}/../..`,
      });
      expect(r.stdout.toString().trim()).toBe(`${want} e3069283`);
    }
  });
});
