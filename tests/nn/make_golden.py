#!/usr/bin/env python3
"""Writes tests/data/gpt2_golden.bin: an independent PyTorch reference for a tiny GPT-2.

Run with Debian's python3-torch (`/usr/bin/python3 tests/nn/make_golden.py`). CI does not run this;
the output file is committed. The model is written from scratch here (not imported from zerone):
GPT-2 with pre-norm blocks, tanh GELU, tied embedding, padded vocabulary whose padded logits are
excluded from the softmax.

File layout (little endian):
  int32[16] header: magic 20261120, version 1, maxT, V, L, NH, C, Vp, B, T, steps, 0...
  float32 lr, beta1, beta2, eps, weight_decay
  int32 inputs (B*T), int32 targets (B*T)
  float32 params, llm.c order (the same bytes as an llm.c v3 checkpoint body)
  float32 logits (B*T*Vp, padded columns as computed), float32 loss
  float32 grads, llm.c order
  float32 losses of `steps` AdamW steps (loss before each step), then the params after them
"""
import struct
import sys

import torch

torch.manual_seed(1234)
torch.set_default_dtype(torch.float64)  # the golden values are computed in double

maxT, V, L, NH, C = 16, 50, 2, 2, 32
Vp = 64
B, T = 2, 8
steps = 5
lr, beta1, beta2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 0.1

names = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b",
         "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
shapes = {"wte": (Vp, C), "wpe": (maxT, C), "ln1w": (L, C), "ln1b": (L, C), "qkvw": (L, 3 * C, C),
          "qkvb": (L, 3 * C), "attprojw": (L, C, C), "attprojb": (L, C), "ln2w": (L, C), "ln2b": (L, C),
          "fcw": (L, 4 * C, C), "fcb": (L, 4 * C), "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
          "lnfw": (C,), "lnfb": (C,)}
params = {}
for n in names:
    if n in ("ln1w", "ln2w", "lnfw"):
        t = 1.0 + 0.1 * torch.randn(shapes[n])
    elif n.endswith("b") and n not in ("wte",):
        t = 0.05 * torch.randn(shapes[n])
    else:
        t = 0.1 * torch.randn(shapes[n])
    if n == "wte":
        t[V:] = 0.0
    # Round to float32 so zerone (which stores f32) starts from exactly these values.
    params[n] = t.float().double().requires_grad_(True)

inputs = torch.randint(0, V, (B, T))
targets = torch.randint(0, V, (B, T))


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3)))


def layernorm(x, w, b):
    return torch.nn.functional.layer_norm(x, (C,), w, b, eps=1e-5)


def forward(p):
    x = p["wte"][inputs] + p["wpe"][:T]  # (B,T,C)
    hs = C // NH
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]  # (B,T,3C)
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / hs ** 0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        h = gelu(h @ p["fcw"][l].T + p["fcb"][l])
        x = x + h @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = layernorm(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"].T  # (B,T,Vp)
    loss = torch.nn.functional.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))
    return logits, loss


logits, loss = forward(params)
loss.backward()
grads = {n: params[n].grad.detach().clone() for n in names}

# AdamW: decay matrices and embeddings (2-D per layer), not biases or norms, as zerone does.
decay_names = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}
opt_params = {n: params[n].detach().clone().requires_grad_(True) for n in names}
opt = torch.optim.AdamW([
    {"params": [opt_params[n] for n in names if n in decay_names], "weight_decay": wd},
    {"params": [opt_params[n] for n in names if n not in decay_names], "weight_decay": 0.0},
], lr=lr, betas=(beta1, beta2), eps=eps)
step_losses = []
for s in range(steps):
    opt.zero_grad()
    _, l_s = forward(opt_params)
    step_losses.append(l_s.item())
    l_s.backward()
    opt.step()


def flat(d):
    return torch.cat([d[n].detach().reshape(-1) for n in names]).float().numpy().tobytes()


out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/gpt2_golden.bin"
with open(out, "wb") as f:
    header = [20261120, 1, maxT, V, L, NH, C, Vp, B, T, steps] + [0] * 5
    f.write(struct.pack("<16i", *header))
    f.write(struct.pack("<5f", lr, beta1, beta2, eps, wd))
    f.write(inputs.to(torch.int32).numpy().tobytes())
    f.write(targets.to(torch.int32).numpy().tobytes())
    f.write(flat({n: params[n] for n in names}))
    f.write(logits.detach().float().numpy().tobytes())
    f.write(struct.pack("<f", loss.item()))
    f.write(flat(grads))
    f.write(struct.pack(f"<{steps}f", *step_losses))
    f.write(flat(opt_params))
print(f"wrote {out}: loss {loss.item():.6f}, step losses {[round(x, 6) for x in step_losses]}")
