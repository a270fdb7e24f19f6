import { describe, expect, test } from "bun:test";
import { LogitsRows } from "../../src/model/index.ts";

describe("LogitsRows", () => {
  test("row r is the r-th vocabSize floats, one view per buffer and row", () => {
    const rows = new LogitsRows(3);
    const a = Float32Array.from([0, 1, 2, 3, 4, 5, 6, 7, 8]);
    expect([...rows.row(a, 2)]).toEqual([6, 7, 8]);
    expect([...rows.row(a, 0)]).toEqual([0, 1, 2]);
    // The same view step after step: sampling a row allocates nothing.
    expect(rows.row(a, 2)).toBe(rows.row(a, 2));
    expect(rows.row(a, 1).buffer).toBe(a.buffer);
    // Another buffer (a grown one, another slot's) has views of its own.
    const b = new Float32Array(9).fill(9);
    expect([...rows.row(b, 2)]).toEqual([9, 9, 9]);
    expect(rows.row(b, 2)).not.toBe(rows.row(a, 2));
  });
});
