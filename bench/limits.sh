# Sourced by the bench/ scripts: the peers' python and the machine limits measured in the same run.
#   peers_python             the python of the peers' environment (bench/peers/setup.sh), or "" when it
#                            cannot be made (then the script skips its PyTorch/DeepSpeed rows and says so)
#   triad_gbs                the triad bandwidth of this moment, GB/s (build/bench/bench_adamw, STREAM counting)
#   gemm_peak_tflops FILTER  the best bf16 or f32 TFLOP/s of the build/bench/bench_matmul benchmarks whose
#                            name matches FILTER (a --benchmark_filter regex); each row is echoed to stderr
# Needs build/bench/bench_adamw and bench_matmul (make); the caller's cwd is the source root.

peers_python() {
  local out
  out=$(bash bench/peers/setup.sh 2>/dev/null | tail -1) || out=""
  if [ -n "$out" ] && "$out" -c "import torch" 2>/dev/null; then echo "$out"; else echo ""; fi
}

triad_gbs() {
  build/bench/bench_adamw --benchmark_filter=Triad --benchmark_counters_tabular=true 2>/dev/null |
    awk '/^BM_Triad/ { v = $NF; sub(/G\/s$/, "", v); print v }'
}

gemm_peak_tflops() {
  build/bench/bench_matmul --benchmark_filter="$1" --benchmark_counters_tabular=true 2>/dev/null |
    awk '/^BM_/ { print > "/dev/stderr"; v = $NF; sub(/\/s$/, "", v); if (v + 0 > m) m = v + 0 } END { print m }'
}
