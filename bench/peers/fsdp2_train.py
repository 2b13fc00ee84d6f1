#!/usr/bin/env python3
"""W3 peer: PyTorch FSDP2 (torch.distributed.fsdp.fully_shard) training zerone's GPT-2 on CPUs over gloo.

Launched by torchrun (one process per rank), e.g.
  OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 bench/peers/fsdp2_train.py --data c_train.bin --stage 3

How ZeRO stages map onto FSDP2: every block is one fully_shard group and the root (embeddings, final
LayerNorm, the tied head) another, on a 1-D CPU DeviceMesh over gloo. Parameters, gradients and the
optimizer state are always sharded (FSDP2 has no ZeRO-1: gradients are reduce-scattered, never
all-reduced and kept whole). --stage 3 keeps reshard_after_forward=True (ZeRO-3: each group's
parameters are gathered for its forward, freed, and gathered again for its backward); --stage 2 sets
reshard_after_forward=False (ZeRO-2-like: the gathered bf16 parameters stay from forward to backward,
so a rank holds the whole bf16 model for the step; only gradients and optimizer state are sharded).

Precision: MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): f32 sharded parameters are
the master weights the optimizer updates, bf16 copies are gathered for compute, gradients are reduced
in f32 — zerone's bf16 with f32 master weights. The optimizer is torch.optim.AdamW (its default
foreach implementation) with zerone's hyper-parameters.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_common as gc  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gc.common_args(p)
    p.add_argument("--stage", type=int, choices=(2, 3), default=3,
                   help="3: reshard_after_forward=True; 2: False (FSDP2 has no stage 1)")
    args = p.parse_args()
    gc.set_threads(args.threads)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rss_after_import = gc.rss_now_bytes()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(args.seed)
    model = gc.GPT2(gc.parse_model(args.model))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reshard = args.stage == 3
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                            weight_decay=args.weight_decay)

    def step(x, y):
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    gc.train_loop(args, rank, world, step, f"fsdp2-stage{args.stage}",
                  extra=dict(rss_after_import=rss_after_import))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
