#!/usr/bin/env python3
"""PyTorch peers for W1 and W2, measured on this machine in the same run as zerone.

  w1 PRECISION STEPS   GPT-2 124M (L12 C768 H12, V 50257 padded to 50304), micro-batch 4, seq 64,
                       AdamW (foreach), PRECISION = fp32 or bf16 (torch.autocast on CPU).
                       Prints the mean seconds per step over STEPS steps after 2 warm-up steps.
  w2 NPARAMS STEPS     torch.optim.AdamW(foreach=True) over NPARAMS f32 parameters; prints Gparam/s.
  w6 LAYERS STEPS      LLaMA with the Llama-3.2-1B shape (C 2048, 32 heads, 8 kv heads, head 64, FFN 8192,
                       V 128256, tied head, RoPE theta 5e5) and LAYERS blocks (the model has 16), B=1,
                       T=256, bf16 autocast, AdamW (per tensor, foreach=False: memory). Attention written out (PyTorch 1.13 has no
                       scaled_dot_product_attention). Prints the mean seconds per step after 1 warm-up.

Needs Debian's python3-torch (/usr/bin/python3).
"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.NH = NH

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.NH)
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, C=768, NH=12, V=50257, Vp=50304, maxT=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(Vp, C), nn.Embedding(maxT, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        self.V = V

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.T
        return F.cross_entropy(logits[..., : self.V].reshape(-1, self.V).float(), targets.reshape(-1))


def w1(precision, steps):
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
    x = torch.randint(0, 50257, (4, 64))
    y = torch.randint(0, 50257, (4, 64))
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(x, y)
        loss.backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    print(f"{sum(times) / len(times):.4f}")


def w2(nparams, steps):
    p = torch.zeros(nparams, requires_grad=True)
    p.grad = torch.randn(nparams)
    opt = torch.optim.AdamW([p], lr=1e-3, foreach=True)
    opt.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    print(f"{nparams * steps / (time.perf_counter() - t0) / 1e9:.4f}")


class LlamaBlock(nn.Module):
    def __init__(self, C, NH, NKV, F_):
        super().__init__()
        self.NH, self.NKV, self.hs = NH, NKV, C // NH
        self.attn_norm = nn.Parameter(torch.ones(C))
        self.wqkv = nn.Linear(C, (NH + 2 * NKV) * self.hs, bias=False)
        self.wo = nn.Linear(NH * self.hs, C, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(C))
        self.w_gate_up = nn.Linear(C, 2 * F_, bias=False)
        self.w_down = nn.Linear(F_, C, bias=False)
        self.F = F_

    @staticmethod
    def rms(x, w, eps=1e-5):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w

    @staticmethod
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def forward(self, x, cos, sin, mask):
        B, T, C = x.shape
        NH, NKV, hs = self.NH, self.NKV, self.hs
        qkv = self.wqkv(self.rms(x, self.attn_norm))
        q = qkv[..., : NH * hs].view(B, T, NH, hs).transpose(1, 2)
        k = qkv[..., NH * hs : (NH + NKV) * hs].view(B, T, NKV, hs).transpose(1, 2)
        v = qkv[..., (NH + NKV) * hs :].view(B, T, NKV, hs).transpose(1, 2)
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        rep = NH // NKV
        k = k[:, :, None].expand(B, NKV, rep, T, hs).reshape(B, NH, T, hs)
        v = v[:, :, None].expand(B, NKV, rep, T, hs).reshape(B, NH, T, hs)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.wo((att @ v).transpose(1, 2).reshape(B, T, NH * hs))
        gu = self.w_gate_up(self.rms(x, self.mlp_norm))
        return x + self.w_down(F.silu(gu[..., : self.F]) * gu[..., self.F :])


class Llama(nn.Module):
    def __init__(self, L=16, C=2048, NH=32, NKV=8, F_=8192, V=128256, theta=500000.0):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.blocks = nn.ModuleList([LlamaBlock(C, NH, NKV, F_) for _ in range(L)])
        self.norm = nn.Parameter(torch.ones(C))
        self.hs, self.theta = C // NH, theta

    def forward(self, idx, targets):
        B, T = idx.shape
        f = 1.0 / (self.theta ** (torch.arange(0, self.hs, 2).float() / self.hs))
        ang = torch.arange(T).float()[:, None] * f[None, :]
        cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x, cos, sin, mask)
        logits = LlamaBlock.rms(x, self.norm) @ self.wte.weight.T  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def w6(layers, steps):
    torch.manual_seed(0)
    model = Llama(L=layers)
    # foreach=False: 1.13's foreach AdamW allocates whole-model temporaries (no room at 16 layers).
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
    x = torch.randint(0, 128256, (1, 256))
    y = torch.randint(0, 128256, (1, 256))
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        opt.step()
        if i >= 1:
            times.append(time.perf_counter() - t0)
    print(f"{sum(times) / len(times):.4f}")


if __name__ == "__main__":
    torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "2")))
    if sys.argv[1] == "w1":
        w1(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "w6":
        w6(int(sys.argv[2]), int(sys.argv[3]))
    else:
        w2(int(sys.argv[2]), int(sys.argv[3]))
