#!/usr/bin/env python3
"""Writes tests/data/hf_gpt2/: a tiny GPT-2 as Hugging Face's GPT2LMHeadModel.save_pretrained stores
it, with the loss PyTorch computes for a fixed batch, as an independent oracle for --init and
`zerone convert --to hf` (tests/cli/convert.sh).

Run with Debian's python3-torch (`/usr/bin/python3 tests/io/make_hf_gpt2_golden.py`). CI does not
run this; the output is committed. The model is written from scratch (transformers is not in
Debian 12) following modeling_gpt2.py: state-dict names transformer.wte / wpe / h.{i}.ln_1 /
attn.c_attn / attn.c_proj / ln_2 / mlp.c_fc / mlp.c_proj / ln_f; Conv1D layers compute
x @ weight + bias with weight stored (in, out); gelu_new (tanh); the head is tied to wte, so
save_pretrained leaves lm_head.weight out of model.safetensors. Tensors are written in
safetensors' format by hand (8-byte header length, JSON header, raw little-endian data).

Files: config.json, model.safetensors, tokens.bin (an llm.c token shard, version 1 uint16, of
B*T+1 tokens), golden.json ({"loss": mean cross-entropy of the first B x T batch, "B", "T"}).
"""
import json
import math
import os
import struct
import sys

import torch

torch.manual_seed(20261122)
L, C, NH, V, CTX, B, T = 2, 32, 4, 257, 16, 2, 16
out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf_gpt2")
os.makedirs(out_dir, exist_ok=True)

params = {}
def p(name, *shape, scale=0.2, shift=0.0):
    params[name] = (torch.randn(*shape, dtype=torch.float64) * scale + shift).to(torch.float32)

p("transformer.wte.weight", V, C)
p("transformer.wpe.weight", CTX, C, scale=0.1)
for i in range(L):
    h = f"transformer.h.{i}."
    p(h + "ln_1.weight", C, scale=0.1, shift=1.0)
    p(h + "ln_1.bias", C, scale=0.1)
    p(h + "attn.c_attn.weight", C, 3 * C)
    p(h + "attn.c_attn.bias", 3 * C, scale=0.05)
    p(h + "attn.c_proj.weight", C, C)
    p(h + "attn.c_proj.bias", C, scale=0.05)
    p(h + "ln_2.weight", C, scale=0.1, shift=1.0)
    p(h + "ln_2.bias", C, scale=0.1)
    p(h + "mlp.c_fc.weight", C, 4 * C)
    p(h + "mlp.c_fc.bias", 4 * C, scale=0.05)
    p(h + "mlp.c_proj.weight", 4 * C, C)
    p(h + "mlp.c_proj.bias", C, scale=0.05)
p("transformer.ln_f.weight", C, scale=0.1, shift=1.0)
p("transformer.ln_f.bias", C, scale=0.1)

tokens = torch.randint(0, V, (B * T + 1,), generator=torch.Generator().manual_seed(7))

def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

def forward(idx):
    P = {k: v.to(torch.float64) for k, v in params.items()}
    b, t = idx.shape
    x = P["transformer.wte.weight"][idx] + P["transformer.wpe.weight"][torch.arange(t)]
    ln = lambda x, w, bias: torch.nn.functional.layer_norm(x, (C,), w, bias, eps=1e-5)
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for i in range(L):
        h = f"transformer.h.{i}."
        a = ln(x, P[h + "ln_1.weight"], P[h + "ln_1.bias"])
        qkv = a @ P[h + "attn.c_attn.weight"] + P[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        x = x + y @ P[h + "attn.c_proj.weight"] + P[h + "attn.c_proj.bias"]
        m = ln(x, P[h + "ln_2.weight"], P[h + "ln_2.bias"])
        m = gelu_new(m @ P[h + "mlp.c_fc.weight"] + P[h + "mlp.c_fc.bias"])
        x = x + m @ P[h + "mlp.c_proj.weight"] + P[h + "mlp.c_proj.bias"]
    x = ln(x, P["transformer.ln_f.weight"], P["transformer.ln_f.bias"])
    return x @ P["transformer.wte.weight"].T  # tied lm_head

inputs = tokens[:B * T].view(B, T)
targets = tokens[1:B * T + 1].view(B, T)
logits = forward(inputs)
loss = torch.nn.functional.cross_entropy(logits.view(-1, V), targets.reshape(-1)).item()

# model.safetensors, in save_pretrained's order (sorted names).
header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
for name in sorted(params):
    raw = params[name].numpy().astype("<f4").tobytes()
    header[name] = {"dtype": "F32", "shape": list(params[name].shape), "data_offsets": [offset, offset + len(raw)]}
    blobs.append(raw)
    offset += len(raw)
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": CTX,
          "n_ctx": CTX, "n_embd": C, "n_layer": L, "n_head": NH, "n_inner": None,
          "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
          "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "torch_dtype": "float32",
          "transformers_version": "4.46.0"}
json.dump(config, open(os.path.join(out_dir, "config.json"), "w"), indent=2)
with open(os.path.join(out_dir, "tokens.bin"), "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens.tolist()))
json.dump({"loss": loss, "B": B, "T": T}, open(os.path.join(out_dir, "golden.json"), "w"))
print(f"wrote {out_dir}: loss {loss:.6f}")
