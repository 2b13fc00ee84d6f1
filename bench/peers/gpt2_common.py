"""What the W3/W4 peer trainers share: zerone's GPT-2 in PyTorch, its data, its timing and memory report.

The model is zerone's gpt2 layout (zerone/nn/gpt2.h, llm.c's train_gpt2.c): token + position embedding,
L pre-norm blocks (LayerNorm eps 1e-5, fused qkv, causal attention, tanh-GELU MLP of 4C), final LayerNorm,
and a head tied to the token embedding. The embedding has Vp = V rounded up to a multiple of 128 rows
(zerone's padded vocabulary); the loss reads the first V logits only, so both engines do the same
matmuls on the same parameter count. Initialisation follows zerone's: N(0, 0.02) for matrices and
embeddings, N(0, 0.02/sqrt(2L)) for the residual projections, zero biases, LayerNorm weights 1, padded
rows 0 (the same distribution, not the same numbers: the first losses agree to about ln(V), not bit
for bit).

Data: an llm.c token shard as `zerone prepare` writes it; micro-step s of rank r reads the B*T+1 tokens
at token ((s * world + r) * B * T) mod the shard, inputs the first B*T, targets the same shifted by one.

Report: one JSON line per rank at exit (`PEER {...}` on stdout, and REPORT.rank<r>.json with --report): the loss of every step, the seconds of every
step (forward, backward and optimizer step, timed on the rank), the peak RSS of the process
(getrusage ru_maxrss, the kernel's VmHWM) and the RSS after importing torch (and DeepSpeed) and
before building the model, so the reader can tell the libraries' own footprint from the run's.
"""
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def rss_now_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def parse_model(spec):
    """"gpt2:layers=4,dim=384,heads=6,vocab=257,ctx=128" -> dict (the keys zerone's parse_model_spec reads)."""
    if not spec.startswith("gpt2:"):
        sys.exit(f"peer: error: model '{spec}': expected gpt2:layers=L,dim=C,heads=H,vocab=V,ctx=T")
    cfg = dict(layers=12, dim=768, heads=12, vocab=50257, ctx=1024)
    for kv in spec[5:].split(","):
        k, v = kv.split("=")
        if k not in cfg:
            sys.exit(f"peer: error: model key '{k}': expected one of {', '.join(cfg)}")
        cfg[k] = int(v)
    cfg["padded_vocab"] = (cfg["vocab"] + 127) // 128 * 128
    return cfg


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.attproj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.NH = NH

    def forward(self, x):  # (B, T, C)
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))  # (B, NH, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attproj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """gather: None, or a context manager factory (DeepSpeed's zero.GatheredParameters) that makes a
    module's parameters whole for the initialisation when they were partitioned at construction
    (deepspeed.zero.Init): the model is then initialised one module at a time, never whole."""

    def __init__(self, cfg, gather=None):
        super().__init__()
        C, L = cfg["dim"], cfg["layers"]
        self.wte, self.wpe = nn.Embedding(cfg["padded_vocab"], C), nn.Embedding(cfg["ctx"], C)
        self.blocks = nn.ModuleList(Block(C, cfg["heads"]) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        self.V = cfg["vocab"]
        for prefix, m in [("wte.", self.wte), ("wpe.", self.wpe), ("lnf.", self.lnf)] + \
                         [(f"blocks.{i}.", b) for i, b in enumerate(self.blocks)]:
            params = list(m.named_parameters(prefix=prefix[:-1]))
            if gather is None:
                self._init(params, L)
            else:
                with gather([p for _, p in params], modifier_rank=0):
                    self._init(params, L)

    @torch.no_grad()
    def _init(self, named_params, L):
        for name, p in named_params:
            if name.endswith("bias"):
                p.zero_()
            elif "ln" in name:
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                p.normal_(0.0, std)
            if name == "wte.weight":
                p[self.V:].zero_()

    def forward(self, idx, targets):  # (B, T), (B, T)
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # (B, T, Vp): the tied head
        return F.cross_entropy(logits[..., : self.V].reshape(-1, self.V).float(), targets.reshape(-1))


class Shard:
    def __init__(self, path, vocab):
        header = np.fromfile(path, dtype=np.int32, count=256)
        dtype = {20240520: np.uint16, 20240801: np.uint32}.get(int(header[0]))
        if dtype is None:
            sys.exit(f"peer: error: '{path}': not an llm.c token shard (magic {header[0]})")
        self.tokens = np.fromfile(path, dtype=dtype, offset=256 * 4, count=int(header[2])).astype(np.int64)
        if self.tokens.max() >= vocab:
            sys.exit(f"peer: error: '{path}' holds token {self.tokens.max()} >= vocab {vocab}")

    def batch(self, step, rank, world, B, T):
        n = len(self.tokens)
        start = ((step * world + rank) * B * T) % (n - B * T - 1)
        chunk = torch.from_numpy(self.tokens[start:start + B * T + 1])
        return chunk[:-1].view(B, T), chunk[1:].view(B, T)


def common_args(parser):
    parser.add_argument("--model", default="gpt2:layers=4,dim=384,heads=6,vocab=257,ctx=128")
    parser.add_argument("--data", required=True, help="an llm.c token shard (zerone prepare)")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-4)  # zerone's defaults: AdamW, constant lr
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.999)
    parser.add_argument("--eps", type=float, default=1e-8)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--report", default="", help="also write each rank's report to REPORT.rank<r>.json")


def train_loop(args, rank, world, step_fn, label, extra=None):
    """Runs args.steps steps of step_fn(inputs, targets) -> loss tensor; prints the PEER line; returns it."""
    shard = Shard(args.data, parse_model(args.model)["vocab"])
    losses, secs = [], []
    for s in range(args.steps):
        x, y = shard.batch(s, rank, world, args.micro_batch, args.seq)
        t0 = time.perf_counter()
        loss = step_fn(x, y)
        secs.append(time.perf_counter() - t0)
        losses.append(float(loss))
        if rank == 0:
            print(f"peer {label} step {s + 1} loss {losses[-1]:.4f} {secs[-1] * 1e3:.1f} ms", file=sys.stderr, flush=True)
    report = dict(peer=label, rank=rank, world=world, losses=losses, secs=secs, peak_rss=peak_rss_bytes(),
                  **(extra or {}))
    print("PEER " + json.dumps(report), flush=True)
    if args.report:
        with open(f"{args.report}.rank{rank}.json", "w") as f:
            json.dump(report, f)
    return report


def set_threads(n):
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
