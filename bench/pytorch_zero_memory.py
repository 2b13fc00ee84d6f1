#!/usr/bin/env python3
"""W3 peer: per-rank memory of PyTorch DDP (+ ZeroRedundancyOptimizer) on the same model as
bench/w3_zero_scaling.sh, on 2 ranks with gloo over loopback (127.0.0.1). Prints, per mode, the
bytes of parameters + gradients + optimizer state per rank (from the tensors themselves) and the
peak RSS per rank. Needs Debian's python3-torch.
  /usr/bin/python3 bench/pytorch_zero_memory.py [WORLD]
"""
import os
import resource
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(__file__))
from pytorch_peer import GPT  # noqa: E402


def run(rank, world, mode, port, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(GPT(L=4, C=384, NH=6, V=257, Vp=384, maxT=128))
    if mode == "zero1":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 257, (4, 128))
    for _ in range(3):
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, x)
        loss.backward()
        opt.step()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    state = opt.optim.state if mode == "zero1" else opt.state
    optim_bytes = sum(t.numel() * t.element_size() for s in state.values() for t in s.values() if torch.is_tensor(t))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.put((mode, rank, params, grads, optim_bytes, rss))
    dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = mp.get_context("spawn")
    for i, mode in enumerate(("ddp", "zero1")):
        q = ctx.Queue()
        procs = [ctx.Process(target=run, args=(r, world, mode, 29500 + i, q)) for r in range(world)]
        for p in procs:
            p.start()
        rows = sorted(q.get() for _ in procs)
        for p in procs:
            p.join()
        mode, rank, params, grads, optim_bytes, rss = rows[0]
        print(f"pytorch {mode} world {world} rank 0: params {params / 2**20:.2f} MiB, grads {grads / 2**20:.2f} MiB, "
              f"optimizer {optim_bytes / 2**20:.2f} MiB, model state {(params + grads + optim_bytes) / 2**20:.2f} MiB, "
              f"peak RSS {rss / 2**20:.1f} MiB")
