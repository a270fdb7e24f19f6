import { closeSync, openSync, readFileSync, readSync, statSync } from "node:fs";

/** The file behind each buffer mapFile made (a view's byteOffset in it is its file offset). */
const mappedPaths = new WeakMap<ArrayBufferLike, string>();

/**
 * The file's bytes as a read-only, file-backed view (Bun.mmap): pages come from the page cache
 * on first touch and are never copied onto the heap, so reading a tensor costs no extra RSS.
 * Empty files cannot be mapped and are returned as an empty array.
 */
export function mapFile(path: string): Uint8Array {
  if (statSync(path).size === 0) return new Uint8Array(0);
  if (typeof Bun !== "undefined" && typeof Bun.mmap === "function") {
    const m = Bun.mmap(path, { shared: false });
    mappedPaths.set(m.buffer, path);
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
  const path = mappedPaths.get(src.buffer);
  if (path === undefined) {
    dst.set(src, at);
    return;
  }
  const fd = openSync(path, "r");
  try {
    for (let done = 0; done < src.length; ) {
      const n = readSync(fd, dst, at + done, src.length - done, src.byteOffset + done);
      if (n === 0) throw new Error(`${path}: ended at byte ${src.byteOffset + done}, want ${src.byteOffset + src.length}`);
      done += n;
    }
  } finally {
    closeSync(fd);
  }
}
