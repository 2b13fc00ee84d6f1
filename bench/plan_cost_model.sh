#!/usr/bin/env bash
# The cost model of `zerone plan` (Note [Cost model] in zerone/zero/cost_model.cc) against real
# runs: for a dozen small configurations (stages 0-3 at world 1 and 2, checkpointing, CPU and NVMe
# offload, micro-batch), `zerone plan --config C --out P` predicts s/step for the settings it
# fills in, `zerone train --config P` runs them, and the table gives predicted, measured (median of
# steps 2..N) and their ratio. The machine's speeds are measured once, first, and given to every
# plan so that all predictions use the same figures.
#   bash bench/plan_cost_model.sh [DIR]   (DIR: a directory on a disk for the NVMe cases; default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
Z=$(readlink -f build/zerone)
dir=$(readlink -f "${1:-build}")
d=$(mktemp -d -p "$dir"); trap 'rm -rf "$d"' EXIT
mkdir "$d/swap"
steps=${PLAN_STEPS:-5}
model=${PLAN_MODEL:-gpt2:layers=6,dim=384,heads=6,vocab=50257,ctx=128}
printf 'Memory is the treasury and guardian of all things. %.0s' $(seq 1 400) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 2)
export OMPI_MCA_mpi_yield_when_idle=1
# The speeds, once (per rank at world 1; the plan divides GEMM among a host's ranks itself only
# when it measures, so world 2 gets half the GEMM figure here).
"$Z" plan --model "$model" --seq 128 --nvme-path "$d/swap" --json > "$d/speed.json"
read -r gemm mem disk < <(python3 -c "
import json; s = json.load(open('$d/speed.json'))['speed']
print(s['gemm_flop_per_s'] / 1e12, s['memory_bytes_per_s'] / 1e9, s['disk_bytes_per_s'] / 1e9)")
echo "speeds: GEMM $gemm TFLOP/s, memory $mem GB/s, disk $disk GB/s (load: $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%-4s %-58s %10s %10s %7s\n' world settings predicted measured ratio
run() {  # WORLD MICRO_BATCH JSON_SETTINGS...
  local world=$1 mb=$2; shift 2
  local name="c$((++n))"
  local swap=""; case "$*" in *nvme*) swap="\"nvme_path\": \"$d/swap\", ";; esac
  echo "{\"model\": \"$model\", \"seq\": 128, \"micro_batch\": $mb, $swap$*}" > "$d/$name.in.json"
  local g; g=$(python3 -c "print($gemm / $world)")
  "$Z" plan --config "$d/$name.in.json" --world $world --gemm-tflops "$g" --memory-bandwidth "$mem" \
    --disk-bandwidth "$disk" --json --out "$d/$name.json" > "$d/$name.plan"
  local launch=(); [ "$world" -gt 1 ] && launch=("${MPI[@]}")
  "${launch[@]}" "$Z" train --config "$d/$name.json" --data "$d/c_train.bin" --steps $steps --metrics "$d/$name.jsonl" > "$d/$name.log" 2>&1 \
    || { echo "run $name failed:"; tail -3 "$d/$name.log"; return; }
  python3 - "$d/$name.plan" "$d/$name.jsonl" "$world" <<'PY'
import json, statistics, sys
plan = json.load(open(sys.argv[1]))
lines = [json.loads(l) for l in open(sys.argv[2]) if '"step"' in l]
measured = statistics.median(l["ms"] for l in lines[1:]) / 1000
predicted = plan["chosen"]["predicted_s_per_step"]
print(f"{sys.argv[3]:<4} {plan['chosen']['flags'][:58]:<58} {predicted:10.3f} {measured:10.3f} {measured / predicted:7.2f}")
PY
}
n=0
run 1 4 '"zero_stage": 0, "activation_checkpointing": false'
run 1 4 '"zero_stage": 0, "activation_checkpointing": true'
run 1 8 '"zero_stage": 0, "activation_checkpointing": false'
run 1 4 '"zero_stage": 1, "offload_optimizer": "cpu", "activation_checkpointing": false'
run 1 4 '"zero_stage": 2, "offload_optimizer": "cpu", "activation_checkpointing": false'
run 1 4 '"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "activation_checkpointing": false'
run 1 4 '"zero_stage": 1, "offload_optimizer": "nvme", "activation_checkpointing": false'
run 1 4 '"zero_stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme", "activation_checkpointing": false'
run 2 4 '"zero_stage": 0, "activation_checkpointing": false'
run 2 4 '"zero_stage": 1, "activation_checkpointing": false'
run 2 4 '"zero_stage": 2, "activation_checkpointing": false'
run 2 4 '"zero_stage": 3, "activation_checkpointing": false'
run 2 4 '"zero_stage": 3, "activation_checkpointing": true, "cpu_checkpointing": true'
