#!/usr/bin/env bash
# W7 (issue 11): the seed examples on Fashion-MNIST against PyTorch 2 (bench/seed_examples_torch.py, eager,
# and with TORCH_COMPILE=1 torch.compile too; the peers from bench/peers/setup.sh) on the same machine in the
# same run: seconds per epoch (the training loop; validation is timed apart) and test accuracy of
# mnist-mlp (SGD lr 0.01, momentum 0.9) and mnist-cnn (SGD lr 0.01, momentum 0.5), micro-batch 64,
# fp32, the same thread count. Runs alternate zerone, PyTorch, zerone, PyTorch, ... so a drift in
# the shared machine's speed hits both; the ratio is taken pair by pair and the median quoted.
#   bash bench/w7_seed_examples.sh [DATA_DIR]   (env: EPOCHS=3 PAIRS=2 THREADS=2 MODELS="mnist-mlp mnist-cnn"
#                                                TORCH_COMPILE=0; with 1 a compiled PyTorch run follows each eager one)
# Target (issue 11): the same accuracy within 1.5 points at >= 3x PyTorch's speed.
set -euo pipefail
cd "$(dirname "$0")/.."
Z=build/zerone
data="${1:-/usr/share/datasets/fashion-mnist}"
EPOCHS=${EPOCHS:-3}; PAIRS=${PAIRS:-2}; THREADS=${THREADS:-2}; MODELS=${MODELS:-"mnist-mlp mnist-cnn"}
source bench/limits.sh
py=$(peers_python)
[ -n "$py" ] || { echo "w7_seed_examples.sh: the PyTorch peer needs the peers' environment (bash bench/peers/setup.sh)" >&2; exit 1; }
modes="eager"; [ "${TORCH_COMPILE:-0}" = 1 ] && modes="eager compile"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
echo "W7: $EPOCHS epochs, $PAIRS pairs, $THREADS threads, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $("$py" -c 'import torch; print("torch", torch.__version__)')"
for model in $MODELS; do
  momentum=0.9; [ "$model" = mnist-cnn ] && momentum=0.5
  for pair in $(seq 1 "$PAIRS"); do
    t0=$(date +%s.%N)
    OMP_NUM_THREADS=$THREADS $Z train --model "$model" --data "$data" --optimizer sgd --lr 0.01 --momentum $momentum \
      --micro-batch 64 --epochs "$EPOCHS" --precision fp32 --threads "$THREADS" --seed $pair \
      --metrics "$d/z.jsonl" > "$d/z.log" 2>&1 || { cat "$d/z.log"; exit 1; }
    tz=$(date +%s.%N)
    for mode in $modes; do
      flag=""; [ $mode = compile ] && flag=--compile
      t1=$(date +%s.%N)
      OMP_NUM_THREADS=$THREADS "$py" bench/seed_examples_torch.py --model "$model" --data "$data" --lr 0.01 \
        --momentum $momentum --micro-batch 64 --epochs "$EPOCHS" --threads "$THREADS" --seed $pair $flag > "$d/t.jsonl" 2>"$d/t.err" ||
        { tail -5 "$d/t.err"; continue; }
      t2=$(date +%s.%N)
      python3 - "$d/z.jsonl" "$d/t.jsonl" "$model" "$pair" "$t0" "$tz" "$t1" "$t2" "$mode" <<'PY'
import json, sys
zpath, tpath, model, pair, t0, tz, t1, t2, mode = sys.argv[1:]
z = [json.loads(l) for l in open(zpath)]
t = [json.loads(l) for l in open(tpath)]
epochs = len(t)
per = len(z) // epochs
# zerone: the epoch's step times (each step's wall time, validation excluded), median over epochs.
z_epoch = sorted(sum(r["ms"] for r in z[e * per:(e + 1) * per]) / 1000 for e in range(epochs))[epochs // 2]
# PyTorch: the median epoch (compiled: of the epochs after the first, which holds the compilation).
tt = [r["train_s"] for r in (t[1:] if mode == "compile" and epochs > 1 else t)]
t_epoch = sorted(tt)[len(tt) // 2]
za, ta = z[-1]["val_accuracy"] * 100, t[-1]["val_accuracy"] * 100
print(f"W7 {model} pair {pair}: zerone {z_epoch:.2f} s/epoch, test acc {za:.2f}% | pytorch {mode} {t_epoch:.2f} s/epoch, "
      f"test acc {ta:.2f}% | speed ratio pytorch/zerone {t_epoch / z_epoch:.2f}x, acc diff {za - ta:+.2f} points | "
      f"whole process {float(tz) - float(t0):.1f} s vs {float(t2) - float(t1):.1f} s")
PY
    done
  done
done
