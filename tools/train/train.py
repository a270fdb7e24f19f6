"""Trains the shipped default model (tl-kjv-small) from Debian's King James Bible text.

  nice -n 5 /usr/bin/python3 tools/train/train.py            # full run, resumes from tools/train/run/
  /usr/bin/python3 tools/train/train.py --steps 20 --work /tmp/smoke --out /tmp/smoke/model   # smoke

Reproducible: every random draw comes from generators seeded by --seed and the step number, so a
resumed run takes the same batches as an uninterrupted one. Writes run/train.log (one JSON line
per log step), run/ckpt.pt every --ckpt-every steps, and the HF folder at the end.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import corpus  # noqa: E402
import hf_folder  # noqa: E402
import llama  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "mlp_bias": False,
    "vocab_size": 1024,
    "tie_word_embeddings": False,
    "bos_token_id": bpe.BOS_ID,
    "eos_token_id": bpe.EOS_ID,
    "initializer_range": 0.02,
    "use_cache": True,
}


def encode_split(enc, lines, chapter_ends):
    """One token stream; each chapter's verses one per line, then </s>. Returns (ids, line starts)."""
    ids, starts = [], []
    for k, line in enumerate(lines):
        starts.append(len(ids))
        ids.extend(enc.encode(line + "\n"))
        if k in chapter_ends:
            ids.append(bpe.EOS_ID)
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(starts, dtype=torch.int64)


def windows_at(stream, offsets, ctx):
    """Rows of <s> + ctx tokens of stream from each offset; inputs are [:, :-1], targets [:, 1:]."""
    idx = offsets[:, None] + torch.arange(ctx)[None, :]
    bos = torch.full((len(offsets), 1), bpe.BOS_ID, dtype=torch.int64)
    return torch.cat([bos, stream[idx]], dim=1)


def val_windows(stream, ctx):
    """The validation set: consecutive non-overlapping windows over the whole held-out stream."""
    n = (len(stream) - 1) // ctx
    return windows_at(stream, torch.arange(n) * ctx, ctx)


@torch.no_grad()
def mean_loss(model, rows, batch=16):
    total, count = 0.0, 0
    for i in range(0, len(rows), batch):
        r = rows[i:i + batch]
        logits = model(r[:, :-1])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), r[:, 1:].reshape(-1), reduction="sum").item()
        count += r[:, 1:].numel()
    return total / count


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def prepare(args):
    """Corpus, tokenizer and token streams; the same on every run."""
    train_lines, val_lines, train_ends, val_ends = corpus.read_kjv_chapters()
    merges = bpe.train(train_lines, CONFIG["vocab_size"])
    enc = bpe.Encoder(merges)
    assert len(enc.vocab) == CONFIG["vocab_size"], len(enc.vocab)
    train_ids, train_starts = encode_split(enc, train_lines, train_ends)
    val_ids, _ = encode_split(enc, val_lines, val_ends)
    ctx = CONFIG["max_position_embeddings"] - 1
    # A window may start at any verse whose window fits in the stream.
    train_starts = train_starts[train_starts + ctx <= len(train_ids)]
    return merges, train_ids, train_starts, val_windows(val_ids, ctx)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1611)
    # One thread: on a shared 2-core machine two OpenMP threads kept waiting on each other (measured
    # ~5 s/step with 2 threads, ~1.5 s/step with 1, same load). --threads 2 on an idle machine.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--val-every", type=int, default=300)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--work", default=os.path.join(ROOT, "tools", "train", "run"))
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "tl-kjv-small"))
    ap.add_argument("--export-only", action="store_true", help="write the folder from the last checkpoint and stop")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.work, exist_ok=True)

    merges, train_ids, train_starts, val_rows = prepare(args)
    ctx = CONFIG["max_position_embeddings"] - 1
    print(f"train tokens {len(train_ids)}, val windows {len(val_rows)} x {ctx}", flush=True)

    model = llama.LlamaForCausalLM(CONFIG)
    model.init_weights(torch.Generator().manual_seed(args.seed))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    keep = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay}, {"params": keep, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    ckpt_path = os.path.join(args.work, "ckpt.pt")
    step, elapsed = 0, 0.0
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed = ck["step"], ck["elapsed"]
        print(f"resumed at step {step}", flush=True)
    log = open(os.path.join(args.work, "train.log"), "a")
    t0 = time.time() - elapsed
    recent = []
    while step < args.steps and not args.export_only:
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        pick = torch.randint(len(train_starts), (args.batch,), generator=g)
        rows = windows_at(train_ids, train_starts[pick], ctx)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        recent.append(loss.item())
        if step % args.log_every == 0 or step == args.steps:
            rec = {"step": step, "loss": sum(recent) / len(recent), "lr": lr_at(step - 1, args), "elapsed_s": round(time.time() - t0, 1)}
            if step % args.val_every == 0 or step == args.steps:
                model.eval()
                rec["val_loss"] = mean_loss(model, val_rows)
                model.train()
            recent = []
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(json.dumps(rec), flush=True)
        if step % args.ckpt_every == 0 or step == args.steps:
            tmp = ckpt_path + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": time.time() - t0}, tmp)
            os.replace(tmp, ckpt_path)
    model.eval()
    hf_folder.write_folder(args.out, model, merges, torch.float16)
    summary = {
        "corpus": "King James Bible, Debian packages bible-kjv 4.38 + bible-kjv-text 4.38 (public domain)",
        "command": " ".join(["nice -n 5 /usr/bin/python3 tools/train/train.py"] + [a for a in sys.argv[1:] if a != "--export-only"]),
        "hyper_parameters": {k: v for k, v in vars(args).items() if k not in ("work", "out", "export_only")},
        "steps": step,
        "context_tokens": ctx + 1,
        "train_tokens_seen": step * args.batch * ctx,
        "wall_s": round(elapsed if args.export_only else time.time() - t0, 1),
        "train_loss_last_50_steps": last_train_loss(os.path.join(args.work, "train.log"), step),
        "val_loss_f32": round(mean_loss(model, val_rows), 4),
    }
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(json.dumps(summary), flush=True)


def last_train_loss(log_path, step):
    """Mean logged training loss over the last 50 steps before `step` (logs every --log-every)."""
    recs = [json.loads(line) for line in open(log_path)]
    recs = [r for r in recs if step - 50 < r["step"] <= step]
    return round(sum(r["loss"] for r in recs) / len(recs), 4) if recs else None

if __name__ == "__main__":
    main()
