"""A byte-level BPE vocabulary, trained here and written as a Hugging Face tokenizer.json.

The pre-tokenizer is GPT-2's split (what HF's ByteLevel pre-tokenizer with use_regex applies),
written with ASCII classes: the corpus is checked to be ASCII, where \\p{L} and \\p{N} are exactly
[A-Za-z] and [0-9]. Token ids: 0 <s>, 1 </s>, 2..257 the 256 bytes, then one per merge.
"""
import collections
import json
import re

SPECIALS = ["<s>", "</s>"]
BOS_ID, EOS_ID = 0, 1
_SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def byte_chars():
    """GPT-2's printable stand-in for each byte, as HF's ByteLevel maps them."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_CHARS = byte_chars()


def pretokenize(text):
    """Text -> list of pre-tokens, each as its byte-level character string."""
    return ["".join(BYTE_CHARS[b] for b in piece.encode("utf-8")) for piece in _SPLIT.findall(text)]


def train(lines, vocab_size):
    """Learns vocab_size - 258 merges from the word counts of lines; returns the merge list."""
    counts = collections.Counter()
    for line in lines:
        counts.update(pretokenize(line + "\n"))
    words = [list(w) for w in counts]
    freq = list(counts.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += freq[i]
            where[(a, b)].add(i)
    merges = []
    while len(merges) < vocab_size - len(SPECIALS) - 256:
        # Ties broken by the pair itself so the result does not depend on dict order.
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]), default=None)
        if best is None or best[1] < 2:
            break
        (a, b), _ = best
        merges.append((a, b))
        for i in list(where[(a, b)]):
            _merge_word(words, freq, i, a, b, pairs, where)
        del pairs[(a, b)]
    return merges


def _merge_word(words, freq, i, a, b, pairs, where):
    """Replaces each (a, b) in word i by a+b, keeping pair counts and the pair index current."""
    w = words[i]
    for p, q in zip(w, w[1:]):
        pairs[(p, q)] -= freq[i]
        if pairs[(p, q)] <= 0:
            del pairs[(p, q)]
    out, j = [], 0
    while j < len(w):
        if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
            out.append(a + b)
            j += 2
        else:
            out.append(w[j])
            j += 1
    words[i] = out
    for p, q in zip(out, out[1:]):
        pairs[(p, q)] += freq[i]
        where[(p, q)].add(i)


class Encoder:
    """Rank-ordered BPE, as HF's BPE model applies merges (lowest rank first)."""

    def __init__(self, merges):
        self.rank = {m: r for r, m in enumerate(merges)}
        self.vocab = {s: i for i, s in enumerate(SPECIALS)}
        for b in range(256):
            self.vocab[BYTE_CHARS[b]] = len(self.vocab)
        for a, b in merges:
            self.vocab[a + b] = len(self.vocab)
        self.inverse = {i: s for s, i in self.vocab.items()}
        self.byte_of = {c: b for b, c in BYTE_CHARS.items()}
        self.cache = {}

    def _word(self, w):
        hit = self.cache.get(w)
        if hit is not None:
            return hit
        parts = list(w)
        while len(parts) > 1:
            ranked = [(self.rank.get((p, q), 1 << 30), k) for k, (p, q) in enumerate(zip(parts, parts[1:]))]
            r, k = min(ranked)
            if r == 1 << 30:
                break
            parts[k:k + 2] = [parts[k] + parts[k + 1]]
        ids = [self.vocab[p] for p in parts]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        return [i for w in pretokenize(text) for i in self._word(w)]

    def decode(self, ids):
        data = bytearray()
        for i in ids:
            s = self.inverse[i]
            if i >= len(SPECIALS):
                data.extend(self.byte_of[c] for c in s)
        return data.decode("utf-8", errors="replace")


def tokenizer_json(merges):
    """The HF tokenizer.json for these merges: BPE model, ByteLevel pre-tokenizer and decoder."""
    enc = Encoder(merges)
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for i, s in enumerate(SPECIALS)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": enc.vocab,
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }


def write_tokenizer(path, merges):
    with open(path, "w") as f:
        json.dump(tokenizer_json(merges), f, ensure_ascii=False, indent=None, separators=(",", ":"))
