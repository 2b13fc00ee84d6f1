#!/usr/bin/env bash
# Reproduces docs/BENCHMARKS.md on this machine: zerone and its peers in the same run.
#   bash bench/run_all.sh            (after `make`; PyTorch peers need Debian's python3-torch)
# Writes the raw results to build/bench_results.txt and prints the table rows.
set -euo pipefail
cd "$(dirname "$0")/.."
Z=build/zerone
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
out=build/bench_results.txt
: > "$out"
log() { echo "$*" | tee -a "$out"; }
py=/usr/bin/python3
have_torch=0
if $py -c "import torch" 2>/dev/null; then have_torch=1; else log "note: python3-torch missing, PyTorch peers skipped (apt-get install python3-torch)"; fi

d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
# Token data for W1: the GPL text, byte tokens (any ids < 50257 serve a speed measurement).
$Z prepare --text /usr/share/common-licenses/GPL-3 --out "$d/w1" >/dev/null

# ---- W1: GPT-2 124M, micro-batch 4, seq 64, one rank
w1_steps=${W1_STEPS:-8}
for p in bf16 fp32; do
  $Z train --model gpt2:vocab=50257 --data "$d/w1_train.bin" --micro-batch 4 --seq 64 --steps "$w1_steps" \
    --precision $p --profile --metrics "$d/w1_$p.jsonl" > "$d/w1_$p.log"
  # mean over steps 3.. (the first steps create the GEMM primitives)
  s=$($py -c "import json,sys; v=[json.loads(l)['ms'] for l in open('$d/w1_$p.jsonl')][2:]; print(f'{sum(v)/len(v)/1000:.4f}')")
  log "W1 zerone $p s/step $s"
  log "W1 zerone $p breakdown: $(grep '^time per step' "$d/w1_$p.log")"
  if [ $have_torch = 1 ]; then
    ps=$($py bench/pytorch_peer.py w1 $p ${W1_TORCH_STEPS:-3})
    log "W1 pytorch $p s/step $ps"
    log "W1 ratio pytorch/zerone $p: $($py -c "print(f'{$ps/$s:.2f}x')")"
  fi
done

# ---- W2: AdamW over 67M parameters against the triad bandwidth
build/bench/bench_adamw --benchmark_counters_tabular=true 2>/dev/null | grep -E '^BM_' | tee -a "$out"
if [ $have_torch = 1 ]; then
  log "W2 pytorch foreach AdamW Gparam/s $($py bench/pytorch_peer.py w2 67108864 5)"
fi

# ---- GEMM limit for the W1 shapes
build/bench/bench_matmul --benchmark_counters_tabular=true 2>/dev/null | grep -E '^BM_' | tee -a "$out"
echo "results in $out"

# ---- W3: ZeRO scaling, per-rank memory beside the formula and PyTorch DDP / ZeroRedundancyOptimizer
bash bench/w3_zero_scaling.sh | tee -a "$out"

# ---- Communication overlap: the communication thread vs MPI_I* + MPI_Wait, world 2
OMPI_MCA_mpi_yield_when_idle=1 mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 2 \
  build/bench/bench_comm_overlap 16 | tee -a "$out"
