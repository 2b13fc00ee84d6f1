#!/usr/bin/env bash
# Reproduces docs/BENCHMARKS.md on this machine: zerone and its peers in the same run.
#   bash bench/run_all.sh            (after `make`; the PyTorch 2 / DeepSpeed peers come from bench/peers/setup.sh)
# Writes the raw results to build/bench_results.txt and prints the table rows.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
out=build/bench_results.txt
: > "$out"
# ---- W1 (GPT-2 124M beside PyTorch 2 eager and compiled, and the GEMM + optimizer limit) and W2 (AdamW
# beside PyTorch 2 fused/foreach and DeepSpeed's CPU Adam); the peers come from bench/peers/setup.sh.
bash bench/w1_gpt2.sh 2>&1 | tee -a "$out"
bash bench/w2_adamw.sh 2>&1 | tee -a "$out"

# ---- W3: ZeRO scaling, per-rank memory beside the formula and PyTorch DDP / ZeroRedundancyOptimizer
bash bench/w3_zero_scaling.sh | tee -a "$out"

# ---- Communication overlap: the communication thread vs MPI_I* + MPI_Wait, world 2
OMPI_MCA_mpi_yield_when_idle=1 mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 2 \
  build/bench/bench_comm_overlap 16 | tee -a "$out"
echo "results in $out"
