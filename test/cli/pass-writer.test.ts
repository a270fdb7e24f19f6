import { expect, test } from "bun:test";
import { PassWriter } from "../../src/cli/pass-writer.ts";

test("pass writer writes each pass of microtasks once and streams between passes", async () => {
  const writes: string[] = [];
  const w = new PassWriter((s) => writes.push(s));
  w.write("In");
  w.write("");
  w.write(" the");
  expect(writes).toEqual([]);
  // The pass ends: what it wrote goes out before anything awaited after it resumes.
  await Promise.resolve();
  expect(writes).toEqual(["In the"]);
  w.write(" beginning");
  await Promise.resolve();
  w.write(" God");
  // An explicit flush leaves nothing for the pass's own.
  w.flush();
  await Promise.resolve();
  expect(writes).toEqual(["In the", " beginning", " God"]);
  w.write("");
  await Promise.resolve();
  expect(writes).toHaveLength(3);
});
