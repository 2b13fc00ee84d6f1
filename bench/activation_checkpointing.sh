#!/usr/bin/env bash
# Activation checkpointing overhead at the W1 shape (issue 10): GPT-2 124M, micro-batch 4, seq 64,
# bf16, one rank. Runs alternate plain / --activation-checkpointing / + --cpu-checkpointing, PAIRS
# times; each run's figure is the median step time of steps 3..STEPS from its metrics (the first
# steps warm caches and primitive caches), and the ratio is taken within a round, so a drift of the
# machine's speed between rounds cancels. Target: checkpointing within 1.35x of plain (one extra
# forward of every block; the head, the loss and the optimizer are not recomputed).
# Usage: bash bench/activation_checkpointing.sh [PAIRS] [STEPS] [MODEL] [MICRO_BATCH] [SEQ]
set -euo pipefail
pairs=${1:-5}; steps=${2:-12}; model=${3:-gpt2-124m}; B=${4:-4}; T=${5:-64}
Z=build/zerone
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
run() {  # run NAME FLAGS... -> prints the median ms/step of steps 3..
  local name=$1; shift
  "$Z" train --model "$model" --micro-batch "$B" --seq "$T" --steps "$steps" --precision bf16 --lr 1e-4 \
    --metrics "$d/$name.jsonl" "$@" > "$d/$name.log" 2>&1 || { cat "$d/$name.log" >&2; exit 1; }
  python3 -c "import json,statistics,sys; v=[json.loads(l)['ms'] for l in open(sys.argv[1])][2:]; print(f'{statistics.median(v):.1f}')" \
    "$d/$name.jsonl"
}
echo "activation checkpointing overhead: $model, micro-batch $B x seq $T, bf16, median ms/step of steps 3..$steps"
echo "round plain_ms ckpt_ms cpu_ckpt_ms ckpt/plain cpu_ckpt/plain"
ratios=(); cpu_ratios=()
for r in $(seq 1 "$pairs"); do
  p=$(run plain); c=$(run ckpt --activation-checkpointing); h=$(run cpu --activation-checkpointing --cpu-checkpointing)
  ratio=$(python3 -c "print(f'{$c/$p:.3f}')"); cpu_ratio=$(python3 -c "print(f'{$h/$p:.3f}')")
  ratios+=("$ratio"); cpu_ratios+=("$cpu_ratio")
  echo "$r $p $c $h $ratio $cpu_ratio"
done
python3 - "${ratios[*]}" "${cpu_ratios[*]}" <<'PY'
import statistics, sys
for name, vals in (("checkpointing/plain", sys.argv[1]), ("cpu checkpointing/plain", sys.argv[2])):
    v = sorted(float(x) for x in vals.split())
    print(f"{name}: median {statistics.median(v):.3f} (min {v[0]:.3f}, max {v[-1]:.3f}) over {len(v)} rounds")
PY
