#!/usr/bin/env python3
"""W3/W4 peer: DeepSpeed ZeRO (stages 1-3, optional CPU/NVMe offload) training zerone's GPT-2 on CPUs.

Launched by torchrun (one process per rank; DeepSpeed reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT from it, as from its own launcher or mpirun's), e.g.
  DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 bench/peers/deepspeed_train.py \
      --data c_train.bin --stage 2

DeepSpeed runs with its CPU accelerator (DS_ACCELERATOR=cpu, set here when unset) and the gloo backend
(deepspeed.init_distributed(dist_backend="gloo"); oneCCL is not installed). The ds_config it builds:
train_micro_batch_size_per_gpu = --micro-batch, gradient_accumulation_steps 1, bf16.enabled (bf16 model,
f32 master weights and optimizer state in DeepSpeed's ZeRO/bf16 optimizers), zero_optimization.stage =
--stage, and DeepSpeed's own AdamW ("optimizer": {"type": "AdamW"}: its CPU fused Adam op, or
DeepSpeedCPUAdam with offload_optimizer; both build on first use with g++ and ninja) with zerone's
hyper-parameters, constant learning rate, no clipping. --offload-optimizer cpu|nvme and --offload-param
nvme (stage 3) set zero_optimization.offload_optimizer / offload_param, NVMe through DeepSpeed's async
I/O op (libaio) under --nvme-path. --print-config prints the ds_config and exits.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_common as gc  # noqa: E402


def ds_config(args):
    cfg = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [args.beta1, args.beta2],
                                                  "eps": args.eps, "weight_decay": args.weight_decay}},
        "zero_optimization": {"stage": args.stage},
    }
    z = cfg["zero_optimization"]
    if args.stage == 3:
        z["stage3_prefetch_bucket_size"] = args.prefetch_bucket_size  # zerone's W3 flag, same meaning
    if args.offload_optimizer != "none":
        z["offload_optimizer"] = {"device": args.offload_optimizer, "pin_memory": False}
        if args.offload_optimizer == "nvme":
            z["offload_optimizer"].update(nvme_path=args.nvme_path, buffer_count=4)
    if args.offload_param != "none":
        z["offload_param"] = {"device": args.offload_param, "pin_memory": False}
        if args.offload_param == "nvme":
            # Each parameter must fit one buffer: the embedding (Vp, C) is the largest.
            m = gc.parse_model(args.model)
            z["offload_param"].update(nvme_path=args.nvme_path, buffer_count=5,
                                      buffer_size=max(args.param_buffer_size, m["padded_vocab"] * m["dim"]))
    if args.sub_group_size:
        z["sub_group_size"] = args.sub_group_size
    return cfg


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gc.common_args(p)
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=1)
    p.add_argument("--offload-optimizer", choices=("none", "cpu", "nvme"), default="none")
    p.add_argument("--offload-param", choices=("none", "cpu", "nvme"), default="none")
    p.add_argument("--nvme-path", default="")
    p.add_argument("--prefetch-bucket-size", type=int, default=2000000)
    p.add_argument("--param-buffer-size", type=int, default=100000000)
    p.add_argument("--sub-group-size", type=int, default=0)
    p.add_argument("--print-config", action="store_true")
    args = p.parse_args()
    if (args.offload_optimizer == "nvme" or args.offload_param != "none") and args.stage != 3:
        sys.exit("peer: error: NVMe optimizer offload and parameter offload need --stage 3 in DeepSpeed")
    if "nvme" in (args.offload_optimizer, args.offload_param) and not args.nvme_path:
        sys.exit("peer: error: nvme offload needs --nvme-path DIR")
    cfg = ds_config(args)
    if args.print_config:
        print(json.dumps(cfg, indent=1))
        return
    gc.set_threads(args.threads)
    import deepspeed
    import torch

    rss_after_import = gc.rss_now_bytes()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(args.seed)
    mcfg = gc.parse_model(args.model)
    if args.stage == 3:
        # ZeRO-3's way to build a model: parameters partitioned (and, with offload_param, sent to their
        # device) as each module is constructed, so no rank ever holds the whole f32 model.
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            model = gc.GPT2(mcfg, gather=deepspeed.zero.GatheredParameters)
    else:
        model = gc.GPT2(mcfg)
    if args.stage == 3:
        # The tied head reads wte.weight outside the embedding module's forward: stage 3 must gather it
        # for the root's forward too.
        deepspeed.zero.register_external_parameter(model, model.wte.weight)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)

    def step(x, y):
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        return loss.detach()

    label = f"deepspeed-stage{args.stage}"
    if args.offload_optimizer != "none":
        label += f"-opt-{args.offload_optimizer}"
    if args.offload_param != "none":
        label += f"-param-{args.offload_param}"
    basic = getattr(engine, "basic_optimizer", None)
    gc.train_loop(args, rank, world, step, label,
                  extra=dict(rss_after_import=rss_after_import, zero_optimizer=type(engine.optimizer).__name__,
                             adam=type(basic).__name__ if basic is not None else ""))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    # The report is written; DeepSpeed's helper threads sometimes abort the interpreter's teardown
    # ("terminate called without an active exception"), which would fail a finished run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
