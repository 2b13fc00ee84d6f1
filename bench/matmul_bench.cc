// GEMM limit: oneDNN matmul throughput for the GPT-2 124M shapes (B*T = 256 rows), f32 and bf16,
// forward (x @ W^T), input gradient (dy @ W) and weight gradient (dy^T @ x).
// Run: build/bench_matmul --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include "zerone/core/memory.h"
#include "zerone/kernels/cpu/matmul.h"

namespace {

using namespace zerone;

// Args: M, N, K, dtype (0 f32, 1 bf16), kind (0 forward A@B^T, 1 A@B, 2 A^T@B accumulate)
void BM_Matmul(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const DType dtype = state.range(3) ? DType::bf16 : DType::f32;
  const int kind = static_cast<int>(state.range(4));
  size_t es = dtype_size(dtype);
  Buffer a(M * K * es, MemCategory::scratch), b(K * N * es, MemCategory::scratch), c(M * N * 4, MemCategory::scratch);
  for (auto _ : state) {
    kernels::cpu::matmul(a.data(), kind == 2, b.data(), kind == 0, c.as<float>(), M, N, K, dtype, kind == 2);
  }
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * M * N * K / 1e12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Matmul)->ArgNames({"M", "N", "K", "bf16", "kind"})
    ->ArgsProduct({{256}, {2304, 3072, 50304}, {768}, {0, 1}, {0}})
    ->Args({256, 768, 3072, 1, 1})->Args({256, 768, 50304, 1, 1})
    ->Args({3072, 768, 256, 1, 2})->Args({50304, 768, 256, 1, 2})
    ->Args({256, 768, 3072, 0, 1})->Args({3072, 768, 256, 0, 2})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
// W6: the Llama-3.2-1B shapes at B*T = 256 (bf16): qkv, o, gate+up, down forward; lm head forward,
// input gradient and weight gradient. Filter with --benchmark_filter=W6.
void BM_MatmulW6(benchmark::State& state) { BM_Matmul(state); }
BENCHMARK(BM_MatmulW6)->ArgNames({"M", "N", "K", "bf16", "kind"})
    ->Args({256, 3072, 2048, 1, 0})->Args({256, 2048, 2048, 1, 0})->Args({256, 16384, 2048, 1, 0})
    ->Args({256, 2048, 8192, 1, 0})->Args({256, 128256, 2048, 1, 0})->Args({256, 2048, 128256, 1, 1})
    ->Args({128256, 2048, 256, 1, 2})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
