#include "zerone/train/throughput.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/core/memory.h"
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

DeviceSpeeds measure_device_speeds(kernels::Backend& device, DType dtype, int gemm_n, size_t copy_bytes) {
  ZERONE_ASSERT(gemm_n >= 1 && copy_bytes >= 4);
  using Clock = std::chrono::steady_clock;
  MemoryArena& device_memory = device.device_arena();
  MemoryArena& host_memory = device.host_arena() != nullptr ? *device.host_arena() : default_arena();
  // The best of up to 5 runs after a warm-up, each waited for on `stream`.
  auto best_seconds = [&](kernels::Stream stream, const std::function<void()>& run) {
    run();
    device.synchronize(stream);
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = Clock::now();
      run();
      device.synchronize(stream);
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return best;
  };
  DeviceSpeeds out;
  {
    // An (n, n) activation operand times an (n, n) weight in the run's parameter precision. The
    // operands hold varied values (a GPU's power draw, and so its clock, depends on them); `inp`
    // is where they are made.
    const size_t n = static_cast<size_t>(gemm_n), elems = n * n;
    const DType param_dtype = dtype;
    Buffer inp(elems * sizeof(float), MemCategory::scratch, MemPlace::device, 256, device_memory);
    Buffer weight(elems * dtype_size(param_dtype), MemCategory::scratch, MemPlace::device, 256, device_memory);
    Buffer out_buf(elems * sizeof(float), MemCategory::scratch, MemPlace::device, 256, device_memory);
    {
      std::vector<float> host(elems);  // once: pageable memory serves (no pinned allocation)
      for (size_t i = 0; i < elems; ++i) host[i] = static_cast<float>(static_cast<int>(i % 61) - 30) / 64.0f;
      device.copy_to_device(inp.data(), host.data(), inp.bytes());
    }
    device.convert(weight.data(), param_dtype, inp.data(), DType::f32, elems);
    const double s = best_seconds(kernels::Stream::compute, [&] {
      // The weights serve as the activation operand too: already in the GEMM's dtype, as most of
      // the models' operands are (Note [GEMM operands in the compute dtype]); the convert of the
      // rest is not in the figure (nor, on the cpu with fp16, is it only the GEMM: the operands are
      // widened to f32 first, Note [fp16 on the CPU]).
      device.linear_forward(out_buf.data(), DType::f32, weight.data(), param_dtype, weight.data(), nullptr, param_dtype,
                            gemm_n, gemm_n, gemm_n);
    });
    out.gemm_flop_per_s = 2.0 * static_cast<double>(n) * n * n / s;
  }
  {
    Buffer a(copy_bytes, MemCategory::scratch, MemPlace::device, 256, device_memory);
    Buffer b(copy_bytes, MemCategory::scratch, MemPlace::device, 256, device_memory);
    Buffer host(copy_bytes, MemCategory::scratch, MemPlace::host, 64, host_memory);
    const double on_device = best_seconds(kernels::Stream::compute, [&] { device.copy_on_device(b.data(), a.data(), copy_bytes); });
    out.memory_bytes_per_s = 2.0 * static_cast<double>(copy_bytes) / on_device;
    const double up = best_seconds(kernels::Stream::host_to_device, [&] { device.copy_to_device(a.data(), host.data(), copy_bytes); });
    const double down = best_seconds(kernels::Stream::device_to_host, [&] { device.copy_to_host(host.data(), b.data(), copy_bytes); });
    out.host_device_bytes_per_s = static_cast<double>(copy_bytes) / std::max(up, down);
  }
  device.release_cached_memory();  // what the measurement used is free again for the run's fit check
  return out;
}

}  // namespace zerone::train
