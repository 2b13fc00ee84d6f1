#!/usr/bin/env bash
# make interop: zerone's TensorBoard event files read by the real `tensorboard` package (PyPI, in the
# peers' environment; not part of `make test`, which stays on Debian packages). Every scalar
# TensorBoard's EventAccumulator loads must equal the metrics JSONL.
# Usage: tensorboard.sh ZERONE PYTHON   (PYTHON: the peers' environment, bench/peers/setup.sh)
set -euo pipefail
Z="$1"; py="$2"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
"$Z" train --model gpt2:layers=1,dim=32,heads=2,vocab=257,ctx=16 --seq 16 --micro-batch 4 --grad-accum 2 --steps 20 \
  --val-every 5 --precision fp16 --threads 1 --tensorboard "$d/tb/run" --metrics "$d/m.jsonl" > "$d/out" 2>&1
"$py" - "$d" <<'PY'
import json, struct, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
import tensorboard
d = sys.argv[1]
acc = EventAccumulator(f"{d}/tb/run", size_guidance={"scalars": 0})
acc.Reload()
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
lines = [json.loads(l) for l in open(f"{d}/m.jsonl")]
want = {"Train/Samples/train_loss": [(l["step"] * 8, f32(l["loss"])) for l in lines],
        "Train/Samples/lr": [(l["step"] * 8, f32(l["lr"])) for l in lines],
        "Train/Samples/loss_scale": [(l["step"] * 8, f32(l["loss_scale"])) for l in lines],
        "Train/Samples/val_loss": [(l["step"] * 8, f32(l["val_loss"])) for l in lines if "val_loss" in l]}
tags = acc.Tags()["scalars"]
ok = True
for tag, rows in want.items():
    got = [(e.step, e.value) for e in acc.Scalars(tag)] if tag in tags else None
    if got != rows:
        print(f"FAIL {tag}: tensorboard read {got}, the JSONL has {rows}"); ok = False
print(f"ok   tensorboard {tensorboard.__version__} reads {sum(len(acc.Scalars(t)) for t in tags)} scalars under tags {sorted(tags)}, equal to the JSONL" if ok else "")
sys.exit(0 if ok else 1)
PY
