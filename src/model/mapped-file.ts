import { readFileSync, statSync } from "node:fs";

/**
 * The file's bytes as a read-only, file-backed view (Bun.mmap): pages come from the page cache
 * on first touch and are never copied onto the heap, so reading a tensor costs no extra RSS.
 * Empty files cannot be mapped and are returned as an empty array.
 */
export function mapFile(path: string): Uint8Array {
  if (statSync(path).size === 0) return new Uint8Array(0);
  if (typeof Bun !== "undefined" && typeof Bun.mmap === "function") return Bun.mmap(path, { shared: false });
  const b = readFileSync(path);
  return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}
