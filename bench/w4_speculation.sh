#!/usr/bin/env bash
# Issue 8, Note [Speculative early step]: what the speculative early step gains and costs, as
# paired same-run ratios. For each setting, A (the early step) and B (--early-step false) run in
# turn, A B A B ..., W4S_PAIRS pairs; each run's figure is its mean s/step over steps 2..N (the
# metrics' "ms"), and the setting's result is the median (min-max) of the pair ratios A/B.
# Settings (W4S_SETTINGS, default all):
#   nvme-exact      no clipping: the exact early step, for reference
#   nvme-validated  --grad-clip 1000: every speculation validated
#   nvme-vs-exact   A as nvme-validated, B the exact early step without clipping: what validating
#                   costs (B is not --early-step false here)
#   nvme-clipped    --grad-clip 0.01 (every step clips): the first step taken back and redone,
#                   the others held back by the prediction
#   nvme-always     as nvme-clipped with ZERONE_SPECULATE=always: every step taken back and redone
#   none-validated  --grad-clip 1000 with the optimizer in memory, ZERONE_SPECULATE=memory: the
#                   undo copies' cost where there is no I/O to hide (by default the engine does
#                   not speculate there)
# Model: W4S_MODEL (default the 45M GPT of docs/BENCHMARKS.md's early-step A/B), micro-batch 4 x
# seq 64, bf16, stage 1, world 1, --threads W4S_THREADS (1).
# Usage: [W4S_PAIRS=4 W4S_STEPS=6 W4S_SETTINGS="..."] bash bench/w4_speculation.sh [DIR on the disk to test]
set -euo pipefail
dir="${1:-/work}"
Z=build/zerone
d=$(mktemp -d -p "$dir"); trap 'rm -rf "$d"' EXIT
mkdir "$d/swap"
model=${W4S_MODEL:-gpt2:layers=6,dim=512,heads=8,vocab=50257,ctx=64}
steps=${W4S_STEPS:-6}
common=(train --model $model --steps $steps --micro-batch 4 --seq 64 --precision bf16 --zero-stage 1
        --threads ${W4S_THREADS:-1})
nvme=(--offload-optimizer nvme --nvme-path "$d/swap" --sub-group-size 5000000)
mean_s() {  # mean_s METRICS: mean s/step over steps 2..N
  python3 -c 'import json,sys; r=[json.loads(l)["ms"] for l in open(sys.argv[1])][1:]; print(sum(r)/len(r)/1000)' "$1"
}
for setting in ${W4S_SETTINGS:-nvme-exact nvme-validated nvme-clipped nvme-always none-validated}; do
  envs=(); a=(); b=()
  case $setting in
    nvme-exact) a=("${nvme[@]}"); b=("${nvme[@]}" --early-step false);;
    nvme-validated) a=("${nvme[@]}" --grad-clip 1000); b=("${a[@]}" --early-step false);;
    nvme-vs-exact) a=("${nvme[@]}" --grad-clip 1000); b=("${nvme[@]}");;
    nvme-clipped) a=("${nvme[@]}" --grad-clip 0.01); b=("${a[@]}" --early-step false);;
    nvme-always) a=("${nvme[@]}" --grad-clip 0.01); b=("${a[@]}" --early-step false); envs=(ZERONE_SPECULATE=always);;
    none-validated) a=(--grad-clip 1000); b=("${a[@]}" --early-step false); envs=(ZERONE_SPECULATE=memory);;
    *) echo "unknown setting $setting"; exit 2;;
  esac
  ratios=()
  for pair in $(seq 1 ${W4S_PAIRS:-4}); do
    env "${envs[@]}" $Z "${common[@]}" "${a[@]}" --metrics "$d/a.jsonl" > "$d/a.log" 2>&1
    $Z "${common[@]}" "${b[@]}" --metrics "$d/b.jsonl" > "$d/b.log" 2>&1
    sa=$(mean_s "$d/a.jsonl"); sb=$(mean_s "$d/b.jsonl")
    counts=$(grep -o "early step.*" "$d/a.log" | sed 's/early step (Note \[Speculative early step\]): //' || true)
    echo "W4-speculation $setting pair $pair: A $sa s/step, B $sb s/step${counts:+ (A: $counts)}"
    ratios+=("$(python3 -c "print($sa / $sb)")")
  done
  python3 -c '
import statistics, sys
r = sorted(float(x) for x in sys.argv[2:])
print(f"| {sys.argv[1]} | {statistics.median(r):.2f} ({r[0]:.2f}-{r[-1]:.2f}) | {len(r)} |")' "$setting" "${ratios[@]}" | tee -a "$d/table"
done
echo "| setting | A/B s/step, median (min-max) | pairs |"
echo "|---|---|---|"
cat "$d/table"
