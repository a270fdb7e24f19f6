import { closeSync, fstatSync, openSync, readFileSync, readSync, statSync } from "node:fs";

/**
 * The open file behind each buffer mapFile made (a view's byteOffset in it is its file offset).
 * The descriptor is taken before mapping and closed when the mapping is collected, so reads
 * through it see the very file that was mapped even if the path is replaced meanwhile.
 */
const mappedFds = new WeakMap<ArrayBufferLike, number>();
const closeWhenCollected = new FinalizationRegistry<number>((fd) => closeSync(fd));

/**
 * The file's bytes as a read-only, file-backed view (Bun.mmap): pages come from the page cache
 * on first touch and are never copied onto the heap, so reading a tensor costs no extra RSS.
 * Empty files cannot be mapped and are returned as an empty array.
 */
export function mapFile(path: string): Uint8Array {
  if (statSync(path).size === 0) return new Uint8Array(0);
  if (typeof Bun !== "undefined" && typeof Bun.mmap === "function") {
    const fd = openSync(path, "r");
    try {
      const m = Bun.mmap(path, { shared: false });
      const size = fstatSync(fd).size;
      if (size !== m.length) throw new Error(`${path} changed while it was mapped: ${m.length} bytes mapped, the file has ${size}`);
      mappedFds.set(m.buffer, fd);
      closeWhenCollected.register(m.buffer, fd);
      return m;
    } catch (e) {
      closeSync(fd);
      throw e;
    }
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
  const fd = mappedFds.get(src.buffer);
  if (fd === undefined) {
    dst.set(src, at);
    return;
  }
  for (let done = 0; done < src.length; ) {
    const n = readSync(fd, dst, at + done, src.length - done, src.byteOffset + done);
    if (n === 0) throw new Error(`mapped file ended at byte ${src.byteOffset + done}, want ${src.byteOffset + src.length}`);
    done += n;
  }
}
