#include "zerone/train/throughput.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "zerone/kernels/cpu/matmul.h"

namespace zerone::train {

namespace {

// The integer after "key=" in a spec such as "gpt2:layers=12,dim=768,...", or -1.
long spec_field(const std::string& spec, const std::string& key) {
  for (size_t pos = spec.find(key + "="); pos != std::string::npos; pos = spec.find(key + "=", pos + 1)) {
    if (pos > 0 && spec[pos - 1] != ':' && spec[pos - 1] != ',') continue;
    return std::strtol(spec.c_str() + pos + key.size() + 1, nullptr, 10);
  }
  return -1;
}

}  // namespace

std::optional<double> model_flops_per_token(const nn::Model& model, int seq) {
  if (model.input_kind() != nn::InputKind::tokens) return std::nullopt;
  const std::string spec = model.spec();
  const long layers = spec_field(spec, "layers"), dim = spec_field(spec, "dim");
  if (layers <= 0 || dim <= 0) return std::nullopt;
  return 6.0 * static_cast<double>(model.num_parameters()) + 12.0 * layers * dim * static_cast<double>(seq);
}

double measure_gemm_peak_tflop_per_s(DType dtype) {
  const DType gemm_dtype = dtype == DType::bf16 ? DType::bf16 : DType::f32;
  constexpr int64_t n = 1024;
  const size_t elems = static_cast<size_t>(n * n);
  std::vector<float> a(elems, 0.5f), b(elems, 0.25f), c(elems);
  std::vector<uint16_t> a16, b16;
  const void* pa = a.data();
  const void* pb = b.data();
  if (gemm_dtype == DType::bf16) {
    a16.assign(elems, 0x3f00);  // 0.5 in bf16
    b16.assign(elems, 0x3e80);  // 0.25
    pa = a16.data();
    pb = b16.data();
  }
  using Clock = std::chrono::steady_clock;
  kernels::cpu::matmul(pa, false, pb, false, c.data(), n, n, n, gemm_dtype, false);  // creates the primitive
  double best_s = 1e30;
  const auto start = Clock::now();
  for (int rep = 0; rep < 8; ++rep) {
    const auto t0 = Clock::now();
    kernels::cpu::matmul(pa, false, pb, false, c.data(), n, n, n, gemm_dtype, false);
    const auto t1 = Clock::now();
    best_s = std::min(best_s, std::chrono::duration<double>(t1 - t0).count());
    if (rep >= 2 && std::chrono::duration<double>(t1 - start).count() > 0.1) break;
  }
  return 2.0 * n * n * n / best_s / 1e12;
}

}  // namespace zerone::train
