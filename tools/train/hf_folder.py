"""Reads and writes the Hugging Face model folder: safetensors (written by hand: 8-byte LE header
length, JSON header of dtype/shape/data_offsets, raw little-endian data), config.json,
tokenizer.json, tokenizer_config.json and generation_config.json."""
import json
import os
import struct

import torch

import bpe

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_NAMES = {v: k for k, v in _DTYPES.items()}

# The model knows verses, not roles: each message is a line of text and the reply is the next line.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}{% if not loop.first %}\n{% endif %}{{ message['content'] | trim }}{% endfor %}"
    "{% if add_generation_prompt %}\n{% endif %}"
)


def write_safetensors(path, tensors, dtype):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(dtype).contiguous().numpy().tobytes()
        header[name] = {"dtype": _NAMES[dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # data starts 8-byte aligned, as the reference writer pads
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """name -> float32 tensor."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        t = torch.frombuffer(bytearray(raw[base + lo:base + hi]), dtype=_DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).float()
    return out


def write_folder(out_dir, model, merges, dtype):
    os.makedirs(out_dir, exist_ok=True)
    c = dict(model.config)
    c["torch_dtype"] = {torch.float16: "float16", torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(out_dir, "model.safetensors"), model.state_dict(), dtype)
    bpe.write_tokenizer(os.path.join(out_dir, "tokenizer.json"), merges)
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bpe.SPECIALS[bpe.BOS_ID],
        "eos_token": bpe.SPECIALS[bpe.EOS_ID],
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": c["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    gen_cfg = {"bos_token_id": bpe.BOS_ID, "eos_token_id": bpe.EOS_ID, "do_sample": True, "temperature": 0.8, "top_p": 0.95}
    for name, obj in (("tokenizer_config.json", tok_cfg), ("generation_config.json", gen_cfg)):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")


def read_folder(model_dir):
    """(config, float32 state dict, Encoder) from a shipped folder, independent of training files."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tj = json.load(f)
    merges = [tuple(m.split(" ")) for m in tj["model"]["merges"]]
    enc = bpe.Encoder(merges)
    if enc.vocab != tj["model"]["vocab"]:
        raise ValueError("tokenizer.json vocab is not the trainer's layout for its merges")
    return config, read_safetensors(os.path.join(model_dir, "model.safetensors")), enc
