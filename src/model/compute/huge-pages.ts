// THE HUGE PAGES. A kernel memory is advised to Linux as MADV_HUGEPAGE when it is made, before
// any byte of it is written, so the weights and the KV slab are backed by 2 MiB pages where the
// kernel has them (transparent huge pages in "madvise" or "always" mode). A decode streams
// gigabytes a token through the cores, and with 4 KiB pages every 4 KiB of it is a TLB miss: a
// page walk that a virtual machine doubles (guest and host tables). Measured with 2 MiB pages
// against 4 KiB (bench/decode-ab.ts, Intel Xeon KVM guest, 2 threads, 3 rounds each,
// decode-ab.s17-hugepages-*.json): 1B Q4_K_M 51.2 -> 46.0 ms a token (1.11x), 8B Q4_K_M 267.7
// -> 244.9 (1.09x), 1B F16 120.1 -> 104.9 (1.15x). An AMD EPYC guest gave 1.00-1.06x in an
// earlier session (README), so it is worth nothing there and costs nothing.
//
// Advice, not a demand: where the host has no transparent huge pages, or no glibc to call
// madvise through, the memory stays on 4 KiB pages and runs as before, the same bits either way
// (pages never change what is computed). MatmulKernel.hugePages says which, and the engine's
// ready line carries it.
import { existsSync, readFileSync } from "node:fs";

/** MADV_HUGEPAGE from linux/mman.h (the same number on every Linux architecture). */
const MADV_HUGEPAGE = 14;
/** Where Linux says its transparent huge page mode: "always [madvise] never", the brackets on the one in force. */
const THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled";

type Ffi = typeof import("bun:ffi");
type Libc = { madvise(addr: ReturnType<Ffi["ptr"]>, length: bigint, advice: number): number; ptr: Ffi["ptr"] };

let libc: Libc | null | undefined;

/** madvise from glibc through Bun's FFI, or null where there is none (another OS or runtime, musl). */
function madviseFn(): Libc | null {
  if (libc !== undefined) return libc;
  libc = null;
  if (process.platform !== "linux" || typeof Bun === "undefined") return libc;
  try {
    // Required here, not imported: only Bun has it, and only on Linux is it called.
    const ffi = require("bun:ffi") as Ffi;
    const lib = ffi.dlopen("libc.so.6", {
      madvise: { args: [ffi.FFIType.ptr, ffi.FFIType.u64, ffi.FFIType.i32], returns: ffi.FFIType.i32 },
    });
    libc = { madvise: lib.symbols.madvise, ptr: ffi.ptr };
  } catch {
    libc = null;
  }
  return libc;
}

/** Whether this host hands out transparent huge pages to a region advised so: its mode is "always" or "madvise". */
export function transparentHugePages(): boolean {
  if (!existsSync(THP_MODE)) return false;
  const mode = /\[(\w+)\]/.exec(readFileSync(THP_MODE, "utf8"))?.[1];
  return mode === "always" || mode === "madvise";
}

/**
 * Advises the `bytes` of address space from memory's byte 0 (its whole reservation: a shared
 * WebAssembly memory reserves its maximum when made, and grows within it) as MADV_HUGEPAGE.
 * Call it before the memory is written: a page already there stays 4 KiB. True when the advice
 * was taken and the host hands out huge pages.
 */
export function adviseHugePages(memory: WebAssembly.Memory, bytes: number): boolean {
  if (!transparentHugePages()) return false;
  const c = madviseFn();
  if (c === null) return false;
  const at = c.ptr(new Uint8Array(memory.buffer));
  return c.madvise(at, BigInt(bytes), MADV_HUGEPAGE) === 0;
}
