"""Evaluates the SHIPPED folder (models/tl-kjv-small), not the training checkpoint.

  /usr/bin/python3 tools/train/eval.py                 # prints val loss, checks it against training.json
  /usr/bin/python3 tools/train/eval.py --write         # also (re)writes expected.json and training.json's val loss

Validation loss: the held-out chapters (every 25th, see corpus.py), encoded with the shipped
tokenizer.json, in consecutive <s>-prefixed windows, forwarded with the shipped weights in f32.
expected.json: greedy continuations of two fixed prompts by this reference forward (full
recompute per token, no cache), with the smallest top-1/top-2 logit margin seen, for the engine
tests to match token for token.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import corpus  # noqa: E402
import hf_folder  # noqa: E402
import llama  # noqa: E402
import train  # noqa: E402

PROMPTS = ["In the beginning God created", "And Jesus said unto them,"]
NEW_TOKENS = 32


def load(model_dir):
    config, weights, enc = hf_folder.read_folder(model_dir)
    model = llama.LlamaForCausalLM(config)
    model.load_state_dict(weights)
    model.eval()
    return config, model, enc


def val_loss(model, enc, config):
    _, val_lines, _, val_ends = corpus.read_kjv_chapters()
    ids, _ = train.encode_split(enc, val_lines, val_ends)
    return train.mean_loss(model, train.val_windows(ids, config["max_position_embeddings"] - 1))


@torch.no_grad()
def greedy(model, enc, prompt, n):
    ids = [bpe.BOS_ID] + enc.encode(prompt)
    out, margin = [], float("inf")
    for _ in range(n):
        logits = model(torch.tensor([ids + out]))[0, -1]
        top = torch.topk(logits, 2)
        margin = min(margin, (top.values[0] - top.values[1]).item())
        nxt = int(top.indices[0])
        out.append(nxt)
        if nxt == bpe.EOS_ID:
            break
    return {"prompt": prompt, "prompt_ids": ids, "completion_ids": out, "completion_text": enc.decode(out),
            "min_top2_margin": round(margin, 4)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(train.ROOT, "models", "tl-kjv-small"))
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    config, model, enc = load(args.model)
    loss = val_loss(model, enc, config)
    print(f"val loss (shipped weights): {loss:.4f}")
    record_path = os.path.join(args.model, "training.json")
    expected = {"max_new_tokens": NEW_TOKENS, "greedy": [greedy(model, enc, p, NEW_TOKENS) for p in PROMPTS]}
    for g in expected["greedy"]:
        print(json.dumps(g["prompt"]), "->", json.dumps(g["completion_text"]), f"(margin {g['min_top2_margin']})")
    if args.write:
        record = json.load(open(record_path)) if os.path.exists(record_path) else {}
        record["val_loss_shipped"] = round(loss, 4)
        with open(record_path, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        with open(os.path.join(args.model, "expected.json"), "w") as f:
            json.dump(expected, f, indent=2)
            f.write("\n")
        return
    want = json.load(open(record_path))["val_loss_shipped"]
    stored = json.load(open(os.path.join(args.model, "expected.json")))
    ok = abs(loss - want) < 5e-4 and stored == expected
    print(f"recorded val loss {want:.4f}; expected.json {'matches' if stored == expected else 'DIFFERS'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
