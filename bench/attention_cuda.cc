// Issue 18 §4: the CUDA backend's flash attention alone, forward and backward, timed with CUDA
// events, for the comparison with PyTorch's scaled_dot_product_attention at the same shapes
// (bench/pytorch_peer.py `attention`; scripts/gpu_run.sh runs both in one call).
//   bench_attention_cuda B T NH NKV hs operands(bf16|f16|f32) [reps=20]
// Prints one line per pass: median milliseconds over `reps` timed runs after 3 warm-ups, and the
// TFLOP/s of the causal products (forward 2 products of B*NH*T*T*hs/2 multiply-adds: 2*B*NH*T^2*hs
// FLOP; backward 5 products: 2.5 times that, FlashAttention's convention); with 16-bit operands a
// third line splits the backward into its passes (D, dQ at the 3 products it runs, dK/dV at 4). The operands are normal
// random numbers (never zeros: METHOD.md), made on the host with a fixed seed.
// Exit 2 on bad arguments (a 16-bit dtype at a head size the tensor cores do not take among
// them), 1 without a GPU (it needs one; nothing here is a test). qkv and out are stored in the
// operand dtype, as the models store them; the forward time has no rounding pass in it since
// 2026-11-28 (earlier figures in docs/BENCHMARKS.md include one).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "zerone/kernels/cuda/check.h"
#include "zerone/kernels/cuda/kernels.h"

namespace {

using zerone::DType;

// Device memory of n floats holding normal random numbers (std::mt19937, `seed`).
float* device_randn(size_t n, unsigned seed) {
  std::vector<float> host(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : host) x = normal(rng);
  float* d = nullptr;
  ZERONE_CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
  ZERONE_CUDA_CHECK(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

template <typename F>
double median_ms(int reps, cudaStream_t stream, F&& f) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t start, stop;
  ZERONE_CUDA_CHECK(cudaEventCreate(&start));
  ZERONE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    ZERONE_CUDA_CHECK(cudaEventRecord(start, stream));
    f();
    ZERONE_CUDA_CHECK(cudaEventRecord(stop, stream));
    ZERONE_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0.0f;
    ZERONE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  ZERONE_CUDA_CHECK(cudaEventDestroy(start));
  ZERONE_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: bench_attention_cuda B T NH NKV hs bf16|f16|f32 [reps]\n");
    return 2;
  }
  const int B = std::atoi(argv[1]), T = std::atoi(argv[2]), NH = std::atoi(argv[3]), NKV = std::atoi(argv[4]),
            hs = std::atoi(argv[5]);
  const std::string dtype = argv[6];
  const int reps = argc > 7 ? std::atoi(argv[7]) : 20;
  const DType operands = dtype == "bf16" ? DType::bf16 : dtype == "f16" ? DType::f16 : DType::f32;
  if (B < 1 || T < 1 || NH < 1 || NKV < 1 || NH % NKV != 0 || hs < 1 || reps < 1 ||
      (dtype != "bf16" && dtype != "f16" && dtype != "f32")) {
    std::fprintf(stderr, "bench_attention_cuda: bad arguments (NH a multiple of NKV, all >= 1)\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_attention_cuda: no CUDA GPU\n");
    return 1;
  }
  if (operands != DType::f32 && !zerone::cuda::flash_attention_takes_16bit(operands, hs)) {
    std::fprintf(stderr, "bench_attention_cuda: %s at head size %d does not run on tensor cores here\n", dtype.c_str(), hs);
    return 2;
  }
  const size_t R = static_cast<size_t>(NH + 2 * NKV) * hs, rows = static_cast<size_t>(B) * T;
  // qkv and out are stored in the operand dtype (Note [Attention's inputs and output in the
  // compute dtype]), as PyTorch hands SDPA bf16 tensors; dout and dqkv are f32.
  const size_t elem = operands == DType::f32 ? sizeof(float) : sizeof(uint16_t);
  float* qkv32 = device_randn(rows * R, 1);
  void* qkv = qkv32;
  if (operands != DType::f32) {
    ZERONE_CUDA_CHECK(cudaMalloc(&qkv, rows * R * elem));
    zerone::cuda::convert(qkv, operands, qkv32, DType::f32, rows * R, nullptr);
    ZERONE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  float* dout = device_randn(rows * NH * hs, 2);
  void* out = nullptr;
  float *lse = nullptr, *dqkv = nullptr, *dsum = nullptr;
  void* scratch = nullptr;
  ZERONE_CUDA_CHECK(cudaMalloc(&out, rows * NH * hs * elem));
  ZERONE_CUDA_CHECK(cudaMalloc(&lse, static_cast<size_t>(B) * NH * T * sizeof(float)));
  ZERONE_CUDA_CHECK(cudaMalloc(&dsum, static_cast<size_t>(B) * NH * T * sizeof(float)));
  ZERONE_CUDA_CHECK(cudaMalloc(&dqkv, rows * R * sizeof(float)));
  const size_t scratch_bytes =
      zerone::cuda::flash_attention_scratch_bytes(B, T, NH, NKV, hs, operands, /*backward=*/true);
  if (scratch_bytes) ZERONE_CUDA_CHECK(cudaMalloc(&scratch, scratch_bytes));
  cudaStream_t stream;
  ZERONE_CUDA_CHECK(cudaStreamCreate(&stream));
  auto forward = [&] {
    zerone::cuda::flash_attention_forward(out, lse, qkv, B, T, NH, NKV, hs, operands, scratch, stream);
  };
  auto backward = [&] {
    zerone::cuda::flash_attention_backward(dqkv, dsum, dout, qkv, out, lse, B, T, NH, NKV, hs, operands, scratch,
                                           stream);
  };
  const double fwd_ms = median_ms(reps, stream, forward);
  const double bwd_ms = median_ms(reps, stream, backward);
  const double fwd_flop = 2.0 * B * NH * static_cast<double>(T) * T * hs;  // causal: half of 4*B*NH*T^2*hs
  std::printf("zerone attention B=%d T=%d NH=%d NKV=%d hs=%d %s: forward %.4f ms (%.1f TFLOP/s), backward %.4f ms (%.1f TFLOP/s)\n",
              B, T, NH, NKV, hs, dtype.c_str(), fwd_ms, fwd_flop / fwd_ms / 1e9, bwd_ms, 2.5 * fwd_flop / bwd_ms / 1e9);
  if (operands != DType::f32) {
    // The backward's passes apart (FlashBackwardMarks): D (and dO rounded), dQ (3 of the 7
    // products: scores, dP, dQ), dK/dV (4: scores, dP, dV, dK); medians over the same runs.
    zerone::cuda::FlashBackwardMarks marks;
    cudaEvent_t start, stop;
    for (cudaEvent_t* e : {&marks.after_row_dot, &marks.after_dq, &start, &stop}) ZERONE_CUDA_CHECK(cudaEventCreate(e));
    std::vector<double> row_dot, dq, dkv;
    for (int i = 0; i < reps; ++i) {
      ZERONE_CUDA_CHECK(cudaEventRecord(start, stream));
      zerone::cuda::flash_attention_backward(dqkv, dsum, dout, qkv, out, lse, B, T, NH, NKV, hs, operands, scratch,
                                             stream, &marks);
      ZERONE_CUDA_CHECK(cudaEventRecord(stop, stream));
      ZERONE_CUDA_CHECK(cudaEventSynchronize(stop));
      float a = 0.0f, b = 0.0f, c = 0.0f;
      ZERONE_CUDA_CHECK(cudaEventElapsedTime(&a, start, marks.after_row_dot));
      ZERONE_CUDA_CHECK(cudaEventElapsedTime(&b, marks.after_row_dot, marks.after_dq));
      ZERONE_CUDA_CHECK(cudaEventElapsedTime(&c, marks.after_dq, stop));
      row_dot.push_back(a), dq.push_back(b), dkv.push_back(c);
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double dq_ms = median(dq), dkv_ms = median(dkv);
    std::printf("zerone attention backward passes: D %.4f ms, dQ %.4f ms (%.1f TFLOP/s), dK/dV %.4f ms (%.1f TFLOP/s)\n",
                median(row_dot), dq_ms, 1.5 * fwd_flop / dq_ms / 1e9, dkv_ms, 2.0 * fwd_flop / dkv_ms / 1e9);
  }
  return 0;
}
