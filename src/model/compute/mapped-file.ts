import { closeSync, fstatSync, openSync, readFileSync, readSync, statSync } from "node:fs";

/**
 * The open file behind each buffer mapFile or mapFileBytes made, and the file offset of the
 * buffer's byte 0 (a view's file offset is base + its byteOffset). The descriptor is taken
 * before mapping and closed when every mapping of it is collected, so reads through it see the
 * very file that was mapped even if the path is replaced meanwhile.
 */
interface Mapped {
  readonly file: OpenFile;
  readonly base: number;
}
/** One open descriptor, closed when the last mapping that reads through it is collected. */
interface OpenFile {
  readonly fd: number;
}
const mappedFds = new WeakMap<ArrayBufferLike, Mapped>();
const closeWhenCollected = new FinalizationRegistry<number>((fd) => closeSync(fd));

function openFile(path: string): OpenFile {
  const file = { fd: openSync(path, "r") };
  closeWhenCollected.register(file, file.fd);
  return file;
}

/**
 * Bytes one mapping may hold. Bun's ArrayBuffers stop at 4 GiB (a larger Bun.mmap, ArrayBuffer
 * or SharedArrayBuffer throws "Out of memory"), so a larger file is mapped in windows.
 */
export const MAX_MAPPING = 2 ** 31;

/** A file's bytes as views of ranges: one mapping for a file that fits, a mapping per range past that. */
export interface FileBytes {
  readonly length: number;
  /** Bytes start .. end as a zero-copy, read-only view (at most MAX_MAPPING of them). */
  subarray(start: number, end: number): Uint8Array;
}

/**
 * The file's bytes as mapFile gives them when it fits one mapping; past MAX_MAPPING (a 3B F16,
 * an 8B Q8_0) each range asked for is its own read-only mapping of the open file, so a model of
 * any size is read as views of the file and copyBytes still reads it without touching pages.
 */
export function mapFileBytes(path: string, maxMapping = MAX_MAPPING): FileBytes {
  const size = statSync(path).size;
  if (size <= maxMapping || typeof Bun === "undefined" || typeof Bun.mmap !== "function") return mapFile(path);
  const file = openFile(path);
  return {
    length: size,
    subarray(start: number, end: number): Uint8Array {
      if (!(Number.isInteger(start) && Number.isInteger(end) && 0 <= start && start <= end && end <= size)) {
        throw new RangeError(`${path}: bytes ${start}..${end} of a file of ${size}`);
      }
      if (end - start > maxMapping) throw new RangeError(`${path}: a range of ${end - start} bytes is past the largest mapping (${maxMapping})`);
      if (end === start) return new Uint8Array(0);
      // Through the descriptor, not the path: the same file as every other range.
      const m = Bun.mmap(`/proc/self/fd/${file.fd}`, { shared: false, offset: start, size: end - start });
      if (m.length !== end - start) throw new Error(`${path} changed while it was mapped: ${m.length} bytes at ${start}, want ${end - start}`);
      mappedFds.set(m.buffer, { file, base: start - m.byteOffset });
      return m;
    },
  };
}

/**
 * The file's bytes as a read-only, file-backed view (Bun.mmap): pages come from the page cache
 * on first touch and are never copied onto the heap, so reading a tensor costs no extra RSS.
 * Empty files cannot be mapped and are returned as an empty array.
 */
export function mapFile(path: string): Uint8Array {
  if (statSync(path).size === 0) return new Uint8Array(0);
  if (typeof Bun !== "undefined" && typeof Bun.mmap === "function") {
    const file = openFile(path);
    const m = Bun.mmap(path, { shared: false });
    const size = fstatSync(file.fd).size;
    if (size !== m.length) throw new Error(`${path} changed while it was mapped: ${m.length} bytes mapped, the file has ${size}`);
    mappedFds.set(m.buffer, { file, base: 0 });
    return m;
  }
  const b = readFileSync(path);
  return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}

/**
 * dst[at ..] = src. When src views a file mapFile mapped, its bytes are read from the file
 * instead: the mapping's pages are then never touched, so they never count in this process's
 * RSS (a copied model would otherwise be resident twice until the mapping is collected).
 */
export function copyBytes(dst: Uint8Array, at: number, src: Uint8Array): void {
  const mapped = mappedFds.get(src.buffer);
  if (mapped === undefined) {
    dst.set(src, at);
    return;
  }
  const from = mapped.base + src.byteOffset;
  for (let done = 0; done < src.length; ) {
    const n = readSync(mapped.file.fd, dst, at + done, src.length - done, from + done);
    if (n === 0) throw new Error(`mapped file ended at byte ${from + done}, want ${from + src.length}`);
    done += n;
  }
}
