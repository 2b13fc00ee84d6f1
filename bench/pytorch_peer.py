#!/usr/bin/env python3
"""PyTorch 2 peers for W1, W2 and W6, measured on this machine in the same run as zerone.

  w1 PRECISION MODE STEPS  GPT-2 124M (L12 C768 H12, V 50257 padded to 50304, tied head), micro-batch 4,
                           seq 64, AdamW (fused), PRECISION = fp32 or bf16 (torch.autocast on CPU),
                           MODE = eager or compile (torch.compile of the model; the compilation happens in
                           the warm-up steps and is not timed). Prints the mean seconds per step over
                           STEPS steps after the warm-up (2 steps eager, 3 compiled).
  w2 NPARAMS STEPS         The AdamW step over NPARAMS f32 parameters (one tensor, as zerone's flat
                           buffer): torch.optim.AdamW(fused=True), AdamW(foreach=True) and DeepSpeed's
                           DeepSpeedCPUAdam (adamw_mode=True; its C++ op builds on first use with g++
                           and ninja, before the timed part). Prints one line per kernel: NAME Gparam/s.
  w6 LAYERS MODE STEPS     LLaMA with the Llama-3.2-1B shape (C 2048, 32 heads, 8 kv heads, head 64, FFN
                           8192, V 128256, tied head, RoPE theta 5e5) and LAYERS blocks (the model has
                           16), B=1, T=256, bf16 autocast, AdamW (fused), attention by
                           F.scaled_dot_product_attention (causal, grouped-query). MODE eager or compile.
                           Prints the mean seconds per step after the warm-up (1 step eager, 2 compiled).

  w5 MODE STEPS MB          GPT-2 124M on the GPU (cuda): micro-batch MB, T=1024, bf16 autocast, fused AdamW,
                           attention by F.scaled_dot_product_attention (flash on an H100). MODE eager or
                           compile. Prints the mean seconds per step after the warm-up (2 steps eager, 3
                           compiled), each step ending in torch.cuda.synchronize() (scripts/gpu_run.sh run).

Needs PyTorch 2 (and DeepSpeed for w2): the python printed by `bash bench/peers/setup.sh`.
Threads: OMP_NUM_THREADS (default 2).
"""
import math
import os
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
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))  # (B, NH, T, hs)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, NH, T, hs)
        else:  # PyTorch 1.13 (bench/pytorch_zero_memory.py imports this model under Debian's python3-torch)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.NH)
            att = att.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf")).softmax(-1)
            y = att @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
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
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.T  # (B, T, Vp), tied head
        return F.cross_entropy(logits[..., : self.V].reshape(-1, self.V).float(), targets.reshape(-1))


def timed_steps(model, opt, x, y, bf16, warmup, steps):
    """Mean seconds per step of STEPS steps after WARMUP untimed ones (where torch.compile compiles).
    On cuda each step ends when the GPU is done (torch.cuda.synchronize)."""
    times = []
    dev = x.device.type
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y)
        loss.backward()
        opt.step()
        if dev == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return sum(times) / len(times)


def w1(precision, mode, steps):
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    x = torch.randint(0, 50257, (4, 64))
    y = torch.randint(0, 50257, (4, 64))
    run = torch.compile(model) if mode == "compile" else model
    print(f"{timed_steps(run, opt, x, y, precision == 'bf16', 3 if mode == 'compile' else 2, steps):.4f}")


def w5(mode, steps, mb):
    torch.manual_seed(0)
    model = GPT().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    x = torch.randint(0, 50257, (mb, 1024), device="cuda")
    y = torch.randint(0, 50257, (mb, 1024), device="cuda")
    run = torch.compile(model) if mode == "compile" else model
    print(f"{timed_steps(run, opt, x, y, True, 3 if mode == 'compile' else 2, steps):.4f}")


def w2(nparams, steps):
    def rate(step):
        step()  # warm-up (state allocation)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return nparams * steps / (time.perf_counter() - t0) / 1e9

    for name, kw in (("fused", {"fused": True}), ("foreach", {"foreach": True})):
        p = torch.zeros(nparams, requires_grad=True)
        p.grad = torch.randn(nparams)
        opt = torch.optim.AdamW([p], lr=1e-3, **kw)
        print(f"torch_adamw_{name} {rate(opt.step):.4f}", flush=True)
        del opt, p
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as e:  # noqa: BLE001 (report, do not fail the other rows)
        print(f"deepspeed_cpu_adam unavailable ({type(e).__name__}: {e})")
        return
    p = torch.zeros(nparams, requires_grad=True)
    p.grad = torch.randn(nparams)
    opt = DeepSpeedCPUAdam([p], lr=1e-3, adamw_mode=True)  # builds its op here, before timing
    print(f"deepspeed_cpu_adam {rate(opt.step):.4f}", flush=True)


class LlamaBlock(nn.Module):
    def __init__(self, C, NH, NKV, F_):
        super().__init__()
        self.NH, self.NKV, self.hs = NH, NKV, C // NH
        self.attn_norm = nn.RMSNorm(C, eps=1e-5)
        self.wqkv = nn.Linear(C, (NH + 2 * NKV) * self.hs, bias=False)
        self.wo = nn.Linear(NH * self.hs, C, bias=False)
        self.mlp_norm = nn.RMSNorm(C, eps=1e-5)
        self.w_gate_up = nn.Linear(C, 2 * F_, bias=False)
        self.w_down = nn.Linear(F_, C, bias=False)
        self.F = F_

    @staticmethod
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        NH, NKV, hs = self.NH, self.NKV, self.hs
        qkv = self.wqkv(self.attn_norm(x))
        q = qkv[..., : NH * hs].view(B, T, NH, hs).transpose(1, 2)  # (B, NH, T, hs)
        k = qkv[..., NH * hs : (NH + NKV) * hs].view(B, T, NKV, hs).transpose(1, 2)  # (B, NKV, T, hs)
        v = qkv[..., (NH + NKV) * hs :].view(B, T, NKV, hs).transpose(1, 2)
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, NH * hs))
        gu = self.w_gate_up(self.mlp_norm(x))
        return x + self.w_down(F.silu(gu[..., : self.F]) * gu[..., self.F :])


class Llama(nn.Module):
    def __init__(self, L=16, C=2048, NH=32, NKV=8, F_=8192, V=128256, theta=500000.0):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.blocks = nn.ModuleList([LlamaBlock(C, NH, NKV, F_) for _ in range(L)])
        self.norm = nn.RMSNorm(C, eps=1e-5)
        self.hs, self.theta = C // NH, theta

    def forward(self, idx, targets):
        B, T = idx.shape
        f = 1.0 / (self.theta ** (torch.arange(0, self.hs, 2).float() / self.hs))
        ang = torch.arange(T).float()[:, None] * f[None, :]
        cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = self.norm(x) @ self.wte.weight.T  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def w6(layers, mode, steps):
    torch.manual_seed(0)
    model = Llama(L=layers)
    # fused: one kernel over each tensor, no whole-model temporaries (foreach's would not fit beside
    # 20 GiB of f32 state at 16 layers).
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    x = torch.randint(0, 128256, (1, 256))
    y = torch.randint(0, 128256, (1, 256))
    run = torch.compile(model) if mode == "compile" else model
    print(f"{timed_steps(run, opt, x, y, True, 2 if mode == 'compile' else 1, steps):.4f}")


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if sys.argv[1] == "w1":
        w1(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "w6":
        w6(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "w5":
        w5(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "w2":
        w2(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(f"pytorch_peer.py: unknown workload {sys.argv[1]!r}; expected w1, w2, w5 or w6")
