#!/usr/bin/env python3
"""PyTorch 2 peers for W1, W2, W5 and W6, measured on this machine in the same run as zerone.

  w1 PRECISION MODE STEPS  GPT-2 124M (L12 C768 H12, V 50257 padded to 50304, tied head), micro-batch 4,
                           seq 64, AdamW (fused), PRECISION = fp32 or bf16 (torch.autocast on CPU),
                           MODE = eager or compile (torch.compile of the model; the compilation happens in
                           the warm-up steps and is not timed). Prints the mean seconds per step over
                           STEPS steps after the warm-up (2 steps eager, 3 compiled).
  w2 NPARAMS STEPS         The AdamW step over NPARAMS f32 parameters (one tensor, as zerone's flat
                           buffer): torch.optim.AdamW(fused=True), AdamW(foreach=True) and DeepSpeed's
                           DeepSpeedCPUAdam (adamw_mode=True; its C++ op builds on first use with g++
                           and ninja, before the timed part). Prints one line per kernel: NAME Gparam/s.
  w2_interleaved NPARAMS ROUNDS LIB
                           The same step in ONE process, the contenders taking turns (the first one
                           rotating each round): zerone's pass through LIB (build/bench/
                           libzerone_adamw_shim.so, bench/adamw_shim.cc), DeepSpeedCPUAdam and
                           AdamW(fused=True), each on its own tensors, weight decay 0.01. Prints one
                           line per kernel (median and best Gparam/s over ROUNDS) and zerone's ratios.
  w6 LAYERS MODE STEPS     LLaMA with the Llama-3.2-1B shape (C 2048, 32 heads, 8 kv heads, head 64, FFN
                           8192, V 128256, tied head, RoPE theta 5e5) and LAYERS blocks (the model has
                           16), B=1, T=256, bf16 autocast, AdamW (fused), attention by
                           F.scaled_dot_product_attention (causal, grouped-query). MODE eager or compile.
                           Prints the mean seconds per step after the warm-up (1 step eager, 2 compiled).

  w5 MODE STEPS MB          GPT-2 124M on the GPU (cuda): micro-batch MB, T=1024, bf16 autocast, fused AdamW,
                           attention by F.scaled_dot_product_attention (flash on an H100). MODE eager or
                           compile. Prints the mean seconds per step after the warm-up (2 steps eager, 3
                           compiled), each step ending in torch.cuda.synchronize() (scripts/gpu_run.sh run).
  w5_llama MODE STEPS MB   The w6 model (all 16 blocks) on the GPU: micro-batch MB, T=2048, as w5 otherwise.
  fsdp2_offload STEPS MB   Issue 19: the w5_llama model under FSDP2 with CPUOffloadPolicy, one GPU.
  attention B T NH NKV HS  scaled_dot_product_attention alone on the GPU (flash backend, bf16, causal):
                           median forward and backward milliseconds and TFLOP/s, the line format of
                           bench/attention_cuda.cc (zerone's kernel at the same shape).

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


def w2_interleaved(nparams, rounds, lib_path):
    import ctypes
    import statistics
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    lib = ctypes.CDLL(lib_path)
    lib.zerone_adamw_f32.restype = ctypes.c_double
    lib.zerone_adamw_f32.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t] + [ctypes.c_float] * 5 + [ctypes.c_int]
    z = [torch.zeros(nparams), torch.zeros(nparams), torch.zeros(nparams), torch.randn(nparams)]  # master, m, v, grad
    z_step = [0]

    def zerone_step():
        z_step[0] += 1
        lib.zerone_adamw_f32(*(t.data_ptr() for t in z), nparams, 1e-3, 0.9, 0.999, 1e-8, 0.01, z_step[0])

    def peer(make):
        p = torch.zeros(nparams, requires_grad=True)
        p.grad = torch.randn(nparams)
        return make([p]).step

    steps = {"zerone": zerone_step,
             "deepspeed_cpu_adam": peer(lambda ps: DeepSpeedCPUAdam(ps, lr=1e-3, adamw_mode=True, weight_decay=0.01)),
             "torch_adamw_fused": peer(lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True))}
    times = {name: [] for name in steps}
    order = list(steps)
    for step in steps.values():
        step()  # warm-up: state allocation, DeepSpeed's op build
    for _ in range(rounds):
        order = order[1:] + order[:1]
        for name in order:
            t0 = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - t0)
    median = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name} {nparams / median[name] / 1e9:.4f} Gparam/s median, {nparams / min(t) / 1e9:.4f} best", flush=True)
    for name in ("deepspeed_cpu_adam", "torch_adamw_fused"):
        print(f"zerone / {name}: {median[name] / median['zerone']:.3f}x (speed ratio of the medians)")


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
        f = 1.0 / (self.theta ** (torch.arange(0, self.hs, 2, device=idx.device).float() / self.hs))
        ang = torch.arange(T, device=idx.device).float()[:, None] * f[None, :]
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


def w5_llama(mode, steps, mb, T=2048):
    """Llama-3.2-1B shape on the GPU (issue 18 §4): micro-batch MB, T=2048, bf16 autocast, fused AdamW."""
    torch.manual_seed(0)
    model = Llama().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    x = torch.randint(0, 128256, (mb, T), device="cuda")
    y = torch.randint(0, 128256, (mb, T), device="cuda")
    run = torch.compile(model) if mode == "compile" else model
    print(f"{timed_steps(run, opt, x, y, True, 3 if mode == 'compile' else 2, steps):.4f}")


def fsdp2_offload(steps, mb, T=2048):
    """Issue 19 §4's peer: the Llama-3.2-1B shape on one GPU under FSDP2 (`fully_shard` per block and
    at the root) with CPUOffloadPolicy (parameters, gradients and the AdamW step on the host) and
    bf16 compute (MixedPrecisionPolicy, f32 reduction), world 1 over NCCL (gloo for host tensors).
    Prints the mean seconds per step after 2 warm-up steps."""
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = Llama()
    policy = dict(offload_policy=CPUOffloadPolicy(), mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                                 reduce_dtype=torch.float32))
    for block in model.blocks:
        fully_shard(block, **policy)
    fully_shard(model, **policy)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)  # the host's parameters: the step runs on the CPU
    x = torch.randint(0, 128256, (mb, T), device="cuda")
    y = torch.randint(0, 128256, (mb, T), device="cuda")
    times = []
    for i in range(2 + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x, y).backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    print(f"{sum(times) / len(times):.4f}")
    dist.destroy_process_group()


def attention(B, T, NH, NKV, hs, reps=20):
    """scaled_dot_product_attention alone (flash backend, bf16, causal) at zerone's bench shape
    (bench/attention_cuda.cc): median forward and backward milliseconds over REPS timed runs with
    CUDA events, after 3 warm-ups. GQA's keys and values are expanded to NH heads before timing
    (the flash backend takes equal heads)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(B, NKV, T, hs, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, NKV, T, hs, device="cuda", dtype=torch.bfloat16, generator=g)
    k = k.repeat_interleave(NH // NKV, dim=1).requires_grad_()
    v = v.repeat_interleave(NH // NKV, dim=1).requires_grad_()
    dy = torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16, generator=g)

    def median_ms(f):
        for _ in range(3):
            f()
        times = []
        for _ in range(reps):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            f()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        return sorted(times)[len(times) // 2]

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        bwd = median_ms(lambda: torch.autograd.grad(y, (q, k, v), dy, retain_graph=True))
    flop = 2.0 * B * NH * T * T * hs
    print(f"torch sdpa B={B} T={T} NH={NH} NKV={NKV} hs={hs} bf16: forward {fwd:.4f} ms ({flop / fwd / 1e9:.1f} TFLOP/s), "
          f"backward {bwd:.4f} ms ({2.5 * flop / bwd / 1e9:.1f} TFLOP/s)")


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if sys.argv[1] == "w1":
        w1(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "w6":
        w6(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "w5":
        w5(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "w5_llama":
        w5_llama(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "fsdp2_offload":
        fsdp2_offload(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "attention":
        attention(*map(int, sys.argv[2:7]))
    elif sys.argv[1] == "w2":
        w2(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "w2_interleaved":
        w2_interleaved(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        sys.exit(f"pytorch_peer.py: unknown workload {sys.argv[1]!r}; expected w1, w2, w2_interleaved, w5, w5_llama, w6, fsdp2_offload or attention")
