// GEMM limit: oneDNN matmul throughput for the GPT-2 124M shapes (B*T = 256 rows), f32 and bf16,
// forward (x @ W^T), input gradient (dy @ W) and weight gradient (dy^T @ x).
// Run: build/bench_matmul --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "zerone/core/memory.h"
#include "zerone/kernels/cpu/matmul.h"
#include "zerone/kernels/cpu/onednn.h"

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

// Would the step's GEMMs gain from operands packed ahead of time? oneDNN 2.6's AMX matmul takes
// zerone's plain row-major operands and copies the B operand into its tile layout inside every
// call. Here the same shapes in bf16 with B given in the layout the primitive prefers
// (format_tag::any, reordered once outside the timed loop: what packing weights once per optimizer
// step would buy), beside plain B; `cold` evicts the caches before each call (256 MiB written),
// as a training step's GEMMs find them (each weight is used once per pass, far apart).
// Args: packed, shape (0 qkv forward, 1 fc forward, 2 fcproj forward, 3 head forward, 4 head
// input gradient, 5 fc input gradient, 6 head weight gradient, 7 fc weight gradient), cold.
// The counters report the GEMM alone (manual timing, the eviction outside it). This machine's
// GEMM throughput drifts by 2x within a minute (shared AMX units), so compare packed with plain
// only interleaved:
//   build/bench/bench_matmul --benchmark_filter=Layout --benchmark_repetitions=5
//     --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
// (docs/BENCHMARKS.md, W1: the medians of each pair).
void BM_MatmulLayout(benchmark::State& state) {
  using dnnl::memory;
  struct Shape { int64_t m, n, k; int kind; };  // kind as BM_Matmul's
  static const Shape kShapes[] = {{256, 2304, 768, 0}, {256, 3072, 768, 0}, {256, 768, 3072, 0}, {256, 50304, 768, 0},
                                  {256, 768, 50304, 1}, {256, 768, 3072, 1}, {50304, 768, 256, 2}, {3072, 768, 256, 2}};
  const Shape sh = kShapes[state.range(1)];
  const bool packed = state.range(0) != 0, cold = state.range(2) != 0;
  kernels::cpu::OneDnn& ctx = kernels::cpu::onednn();
  const auto bf16 = memory::data_type::bf16;
  memory::desc a_md = sh.kind == 2 ? memory::desc({sh.m, sh.k}, bf16, {1, sh.m}) : memory::desc({sh.m, sh.k}, bf16, {sh.k, 1});
  memory::desc b_md = sh.kind == 0 ? memory::desc({sh.k, sh.n}, bf16, {1, sh.k}) : memory::desc({sh.k, sh.n}, bf16, {sh.n, 1});
  memory::desc c_md({sh.m, sh.n}, memory::data_type::f32, {sh.n, 1});
  memory::desc b_use = packed ? memory::desc({sh.k, sh.n}, bf16, memory::format_tag::any) : b_md;
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_use, c_md), ctx.engine);
  dnnl::matmul gemm(pd);
  memory a(a_md, ctx.engine), b(b_md, ctx.engine), c(c_md, ctx.engine), b_packed(pd.weights_desc(), ctx.engine);
  std::memset(a.get_data_handle(), 0x3c, a_md.get_size());
  std::memset(b.get_data_handle(), 0x3c, b_md.get_size());
  dnnl::reorder(b, b_packed).execute(ctx.stream, b, b_packed);
  ctx.stream.wait();
  std::vector<char> evict(cold ? 256u << 20 : 0);
  char fill = 0;
  for (auto _ : state) {
    if (cold) std::memset(evict.data(), ++fill, evict.size());
    const auto start = std::chrono::steady_clock::now();
    gemm.execute(ctx.stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, packed ? b_packed : b}, {DNNL_ARG_DST, c}});
    ctx.stream.wait();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  state.counters["TFLOP/s"] =
      benchmark::Counter(2.0 * sh.m * sh.n * sh.k / 1e12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MatmulLayout)->ArgNames({"packed", "shape", "cold"})
    ->ArgsProduct({{0, 1}, {0, 1, 2, 3, 4, 5, 6, 7}, {0, 1}})->Unit(benchmark::kMillisecond)->UseManualTime();

}  // namespace

BENCHMARK_MAIN();
