// Checks a tokenizer.json with @huggingface/tokenizers (the library the engine uses): each line of
// a text file must encode to the ids the Python trainer wrote, and decode back to itself.
// Usage: node check_tokenizer.mjs MODEL_DIR TEXT_FILE IDS_JSON   (run where the package is installed)
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [dir, textFile, idsFile] = process.argv.slice(2);
const tok = new Tokenizer(
  JSON.parse(readFileSync(`${dir}/tokenizer.json`, "utf8")),
  JSON.parse(readFileSync(`${dir}/tokenizer_config.json`, "utf8")),
);
const lines = readFileSync(textFile, "utf8").split("\n");
const want = JSON.parse(readFileSync(idsFile, "utf8"));
if (lines.length !== want.length) throw new Error(`line count ${lines.length} != ${want.length}`);
let bad = 0;
for (let i = 0; i < lines.length; i++) {
  const got = tok.encode(lines[i], { add_special_tokens: false }).ids;
  const same = got.length === want[i].length && got.every((v, k) => v === want[i][k]);
  const back = tok.decode(got, { skip_special_tokens: true });
  if (!same || back !== lines[i]) {
    if (bad++ < 5) console.error(`line ${i}: ${JSON.stringify(lines[i]).slice(0, 80)} got ${got.slice(0, 12)} want ${want[i].slice(0, 12)} back ${JSON.stringify(back).slice(0, 80)}`);
  }
}
console.log(`${lines.length - bad}/${lines.length} lines agree`);
process.exit(bad === 0 ? 0 : 1);
