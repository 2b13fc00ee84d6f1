// W2: the CPU AdamW step against the memory-bandwidth limit, measured in the same binary.
//
// Limit: a STREAM-like triad a[i] = b[i] + s * c[i] over arrays far larger than the caches gives
// the sustainable bandwidth (12 bytes/element counted, as STREAM counts). AdamW moves 30 bytes per
// parameter with a bf16 parameter copy (read master, m, v, grad; write master, m, v, param) plus 4
// for zeroing the gradient in the same pass, so its limit is bandwidth / 34 params/s.
// Run: build/bench_adamw --benchmark_counters_tabular=true   (OMP_NUM_THREADS = cores)
#include <benchmark/benchmark.h>
#include <omp.h>

#include <vector>

#include "zerone/core/memory.h"
#include "zerone/kernels/cpu/adamw.h"

namespace {

using namespace zerone;
constexpr size_t kParams = 64ull << 20;  // 67M parameters: W2 asks for 50M+

void BM_Triad(benchmark::State& state) {
  const size_t n = kParams;
  Buffer a(n * 4, MemCategory::scratch), b(n * 4, MemCategory::scratch), c(n * 4, MemCategory::scratch);
  float* pa = a.as<float>();
  const float* pb = b.as<float>();
  const float* pc = c.as<float>();
  for (auto _ : state) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) pa[i] = pb[i] + 1.5f * pc[i];
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(n) * 12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Triad)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

void BM_AdamW(benchmark::State& state) {
  const size_t n = kParams;
  const bool bf16_param = state.range(0) != 0;
  Buffer master(n * 4, MemCategory::master), m(n * 4, MemCategory::optim), v(n * 4, MemCategory::optim),
      grad(n * 4, MemCategory::grad), param(n * 2, MemCategory::param);
  kernels::AdamWHyper h;
  for (auto _ : state) {
    kernels::cpu::adamw_update(master.as<float>(), m.as<float>(), v.as<float>(), grad.as<float>(),
                               bf16_param ? param.data() : nullptr, DType::bf16, n, h);
    ++h.step;
    benchmark::ClobberMemory();
  }
  double bytes = 28.0 + (bf16_param ? 2 : 0);
  state.counters["Gparam/s"] = benchmark::Counter(static_cast<double>(n) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(n) * bytes, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AdamW)->ArgNames({"bf16_param"})->Args({1})->Args({0})
    ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
