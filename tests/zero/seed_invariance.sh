#!/usr/bin/env bash
# ZeRO invariance of the seed examples (issue 11): an image classifier with every layer kind
# (conv with padding, max pooling, ReLU, flatten, dropout, linear) trained with SGD (momentum,
# Nesterov, weight decay) on IDX data reproduces the world-1 stage-0 trajectory at every ZeRO
# stage 0-3 and world 1-3, with optimizer offload to the host and to NVMe (SGD's momentum and, for
# parameters, stage 3's shards swapped), with and without shuffling.
# The global batch is 12 micro-batches of 4 samples: world w runs grad-accum 12/w, so micro-step k
# of step s on rank r reads the 4 samples from place (k*world + r)*4 of the step's 48 in the epoch's
# (seeded) permutation (Note [Samples] in train/batch_source.h), and
# dropout masks are keyed by the sample's place in the global batch (Note [Dropout keys]).
# 2 epochs of 10 steps, validation at each epoch end:
#   losses and val_loss within 1e-5 relative, val_accuracy equal.
# Validation is sharded over the ranks (Note [Sharded validation] in train/trainer.cc); the last
# section checks that its figures do not depend on the split, even or uneven.
set -euo pipefail
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
python3 "$here/../cli/make_idx.py" "$d/data" 480 100 12 12 5
common=(train --model "seq:in=1x12x12,conv=4:k3:p1,maxpool=2,relu,conv=6:k3,relu,flatten,dropout=0.3,linear=16,relu,linear=5"
        --data "$d/data" --micro-batch 4 --epochs 2 --optimizer sgd --lr 0.015 --momentum 0.9 --nesterov
        --weight-decay 1e-3 --threads 1 --reduce-bucket-size 300 --allgather-bucket-size 200
        --stage3-prefetch-bucket-size 2000 --stage3-param-persistence-threshold 100)
run() {  # name world extra-flags...
  local name="$1" world="$2"; shift 2
  "${MPI[@]}" -n "$world" "$Z" "${common[@]}" --precision "${PREC:-fp32}" --grad-accum $((12 / world)) --metrics "$d/$name.jsonl" "$@" \
    > "$d/$name.log" 2>&1 || { cat "$d/$name.log"; exit 1; }
  runs+=("$name")
}
runs=()
for world in 1 2 3; do
  for stage in 0 1 2 3; do run "w${world}_s${stage}" "$world" --zero-stage "$stage"; done
done
run w2_s1_cpu 2 --zero-stage 1 --offload-optimizer cpu
run w3_s3_cpu 3 --zero-stage 3 --offload-optimizer cpu --offload-param cpu
mkdir -p "$d/swap"
run w1_s1_nvme 1 --zero-stage 1 --offload-optimizer nvme --nvme-path "$d/swap" --sub-group-size 500
run w2_s3_nvme 2 --zero-stage 3 --offload-optimizer nvme --offload-param nvme --nvme-path "$d/swap" --sub-group-size 700
python3 - "$d" "${runs[@]}" <<'PY'
import json, sys
d, names = sys.argv[1], sys.argv[2:]
def read(name):
    return [json.loads(l) for l in open(f"{d}/{name}.jsonl")]
ref = read(names[0])
assert len(ref) == 20 and [l["step"] for l in ref if "val_accuracy" in l] == [10, 20], "unexpected reference run"
failed = False
for name in names:
    run = read(name)
    worst = max(abs(a["loss"] - b["loss"]) / max(1e-3, abs(b["loss"])) for a, b in zip(run, ref))
    val = [(a.get("val_loss"), a.get("val_accuracy"), b.get("val_loss"), b.get("val_accuracy")) for a, b in zip(run, ref)]
    val_ok = all((x is None) == (z is None) and (x is None or abs(x - z) <= 1e-5 * abs(z)) and y == w for x, y, z, w in val)
    ok = len(run) == len(ref) and worst <= 1e-5 and val_ok
    failed |= not ok
    print(f"{'ok' if ok else 'FAIL'}: {name}: worst loss rel. diff {worst:.2e}, final val acc {run[-1].get('val_accuracy')}")
sys.exit(1 if failed else 0)
PY
# Without shuffling the same rule holds (reading the data in order).
runs=()
run w1_s0_ordered 1 --zero-stage 0 --no-shuffle
run w2_s2_ordered 2 --zero-stage 2 --no-shuffle
run w3_s3_ordered 3 --zero-stage 3 --no-shuffle
python3 - "$d" "${runs[@]}" <<'PY'
import json, sys
d, names = sys.argv[1], sys.argv[2:]
runs = [[json.loads(l)["loss"] for l in open(f"{d}/{n}.jsonl")] for n in names]
worst = max(abs(a - b) / max(1e-3, abs(b)) for r in runs[1:] for a, b in zip(r, runs[0]))
shuffled = [json.loads(l)["loss"] for l in open(f"{d}/w1_s0.jsonl")]
ok = worst <= 1e-5 and runs[0] != shuffled and all(len(r) == 20 for r in runs)
print(f"{'ok' if ok else 'FAIL'}: --no-shuffle at world 1-3: worst loss rel. diff {worst:.2e} (and differs from the shuffled run)")
sys.exit(0 if ok else 1)
PY
# bf16 parameters (fp32 master in the optimizer): the NVMe-swapped SGD state (master + momentum)
# gives bit for bit the in-memory trajectory.
runs=()
PREC=bf16 run w2_s2_bf16 2 --zero-stage 2
PREC=bf16 run w2_s2_bf16_nvme 2 --zero-stage 2 --offload-optimizer nvme --nvme-path "$d/swap" --sub-group-size 600
python3 - "$d" "${runs[@]}" <<'PY'
import json, sys
d, a, b = sys.argv[1:]
la = [json.loads(l)["loss"] for l in open(f"{d}/{a}.jsonl")]
lb = [json.loads(l)["loss"] for l in open(f"{d}/{b}.jsonl")]
ok = la == lb and len(la) == 20
print(f"{'ok' if ok else 'FAIL'}: bf16 SGD with its state on NVMe is bitwise the in-memory run")
sys.exit(0 if ok else 1)
PY

# Sharded validation: each rank evaluates its share of the validation chunks (chunks r, r+w, ...)
# and the sums are all-reduced. 101 test samples in chunks of 4 are 26 chunks, the last holding
# one sample: world 2 splits them 13/13 (52/49 samples), world 3 9/9/8 (36/33/32), so at stage 3
# rank 2 runs one uncounted forward to keep the parameter gathers collective (a missing one hangs
# the job); --val-batches 5 at world 3 splits 5 chunks 2/2/1. At every epoch end val_accuracy
# equals world 1's exactly and val_loss within 1e-6 relative; rank 0's log names its share.
python3 "$here/../cli/make_idx.py" "$d/data101" 480 101 12 12 5
val_common=("${common[@]/#$d\/data/$d/data101}")
runs=()
vrun() {  # name world share extra-flags...
  local name="$1" world="$2" share="$3"; shift 3
  "${MPI[@]}" -n "$world" "$Z" "${val_common[@]}" --precision fp32 --grad-accum $((12 / world)) --metrics "$d/$name.jsonl" "$@" \
    > "$d/$name.log" 2>&1 || { cat "$d/$name.log"; exit 1; }
  grep -q "epoch 1 (step 10): val loss .*($share)" "$d/$name.log" || { echo "FAIL: $name: no '($share)' in:"; cat "$d/$name.log"; exit 1; }
  runs+=("$name")
}
vrun v_w1_s0 1 "101 samples" --zero-stage 0
vrun v_w2_s0 2 "101 samples, 52 on rank 0" --zero-stage 0
vrun v_w2_s3 2 "101 samples, 52 on rank 0" --zero-stage 3
vrun v_w3_s2 3 "101 samples, 36 on rank 0" --zero-stage 2
vrun v_w3_s3 3 "101 samples, 36 on rank 0" --zero-stage 3
vrun v_w1_b5 1 "20 samples" --zero-stage 0 --val-batches 5
vrun v_w3_b5 3 "20 samples, 8 on rank 0" --zero-stage 3 --val-batches 5
python3 - "$d" "${runs[@]}" <<'PY'
import json, sys
d, names = sys.argv[1], sys.argv[2:]
def vals(name):
    return [(l["step"], l["val_loss"], l["val_accuracy"]) for l in map(json.loads, open(f"{d}/{name}.jsonl")) if "val_loss" in l]
failed = False
for name in names:
    ref = vals("v_w1_b5" if name.endswith("_b5") else "v_w1_s0")
    got = vals(name)
    ok = len(got) == 2 and [g[0] for g in got] == [10, 20] and all(
        g[0] == r[0] and g[2] == r[2] and abs(g[1] - r[1]) <= 1e-6 * abs(r[1]) for g, r in zip(got, ref))
    failed |= not ok
    print(f"{'ok' if ok else 'FAIL'}: sharded validation {name}: {got} (world 1: {ref})")
sys.exit(1 if failed else 0)
PY
