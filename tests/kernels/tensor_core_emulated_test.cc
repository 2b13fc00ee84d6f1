// The tensor-core flash attention (zerone/kernels/cuda/attention_tensor_cores.cuh/.cu) on the emulated
// GPU (Note [Emulated warps], emulated_gpu.h: this program links the CUDA backend built for the host)
// against the double reference (tests/reference_ops.h): forward (out, lse) and backward (D, dQ, dK/dV)
// through the entry points attention.cu dispatches to, at the op harness's tensor-core shapes
// (tests/kernels/backend_ops_test.cc, Note [Flash attention rows]) and others that cut the 128-row
// blocks, the 64-row tiles and the 16-row chunks short, with outputs that start as NaN. No GPU is
// needed: this is how the kernels' indexing, masking, fragment layouts and cp.async pipelining are
// checked on every machine, before a GPU session runs them (the GPU runs the op harness's `*_cuda`
// rows). The emulation is not the hardware: tolerances are the harness's for 16-bit operands, not bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/reference_ops.h"
#include "zerone/core/dtype.h"
#include "zerone/kernels/cuda/flash_common.cuh"

namespace zerone::cuda {
namespace {

using ref::Vec;

uint16_t round_to(DType dtype, float x) { return dtype == DType::bf16 ? f32_to_bf16(x) : f32_to_f16(x); }
float widen(DType dtype, uint16_t bits) { return dtype == DType::bf16 ? bf16_to_f32(bits) : f16_to_f32(bits); }

// |have - want| <= tol * max(1, the largest |want|) for every element; NaN never passes.
void expect_close(const std::vector<double>& have, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(have.size(), want.size()) << what;
  double scale = 1.0;
  for (double x : want) scale = std::max(scale, std::abs(x));
  size_t bad = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(have[i] - want[i]);
    if (!(err <= tol * scale)) {
      if (bad++ == 0) first = i;
      worst = std::isnan(err) ? err : std::max(worst, err);
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " values off by more than " << tol * scale
                     << " (worst " << worst << "), first at " << first << ": " << have[first] << " for " << want[first];
}

struct Case {
  int B, T, NH, NKV, hs;
};

std::string name_of(const Case& c, const char* dtype) {
  std::ostringstream name;
  name << "B" << c.B << "_T" << c.T << "_NH" << c.NH << "_NKV" << c.NKV << "_hs" << c.hs << "_" << dtype;
  return name.str();
}

// Forward, then backward (the pass that forms D and rounds dO, dQ, dK/dV), through the entry points
// attention.cu dispatches to, their kernels on the emulated GPU.
void run_case(const Case& c, DType dtype, uint64_t seed, double tol, double lse_tol) {
  SCOPED_TRACE(name_of(c, dtype_name(dtype)));
  const FlashShape s{c.B, c.T, c.NH, c.NKV, c.hs};
  const int R = (c.NH + 2 * c.NKV) * c.hs, C = c.NH * c.hs;
  const size_t BT = static_cast<size_t>(c.B) * c.T, stats = static_cast<size_t>(c.B) * c.NH * c.T;
  ASSERT_TRUE(tensor_core_flash_takes(dtype, c.hs));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> qkv(BT * R);
  std::vector<float> dout(BT * C);
  Vec qkv_seen(qkv.size()), dout_seen(dout.size());  // what the kernels multiply: the 16-bit values
  for (size_t i = 0; i < qkv.size(); ++i) {
    qkv[i] = round_to(dtype, normal(rng));
    qkv_seen[i] = widen(dtype, qkv[i]);
  }
  for (size_t i = 0; i < dout.size(); ++i) {
    dout[i] = normal(rng);
    dout_seen[i] = widen(dtype, round_to(dtype, dout[i]));
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hs));

  // Outputs start as NaN (0xff bytes): an element a kernel should write and does not stays NaN.
  std::vector<uint16_t> out(BT * C, 0xffff);
  std::vector<float> lse(stats, std::nanf(""));
  tensor_core_flash_forward(out.data(), lse.data(), qkv.data(), s, dtype, scale, nullptr);
  std::vector<double> out_seen(out.size());
  for (size_t i = 0; i < out.size(); ++i) out_seen[i] = widen(dtype, out[i]);
  expect_close(out_seen, ref::gqa_attention(qkv_seen, c.B, c.T, c.NH, c.NKV, c.hs), tol, "out");
  const Vec lse_want = ref::gqa_attention_lse(qkv_seen, c.B, c.T, c.NH, c.NKV, c.hs);
  for (size_t i = 0; i < stats; ++i) ASSERT_NEAR(lse[i], lse_want[i], lse_tol) << "lse " << i;

  std::vector<float> dqkv(qkv.size(), std::nanf("")), dsum(stats);
  std::vector<uint16_t> scratch(tensor_core_flash_scratch_elems(s, true));
  tensor_core_flash_backward(dqkv.data(), dsum.data(), dout.data(), qkv.data(), out.data(), lse.data(), s, dtype, scale,
                             scratch.data(), nullptr, nullptr);
  expect_close(std::vector<double>(dqkv.begin(), dqkv.end()),
               ref::gqa_attention_grad(qkv_seen, dout_seen, c.B, c.T, c.NH, c.NKV, c.hs), tol, "dqkv");
}

// The op harness's tolerances for 16-bit operands (attention_case in backend_ops_test.cc).
void run_bf16(const Case& c, uint64_t seed) { run_case(c, DType::bf16, seed, 3e-2, 5e-2); }
void run_f16(const Case& c, uint64_t seed) { run_case(c, DType::f16, seed, 5e-3, 1e-2); }

// Head size 64 (GPT-2's, Llama-3's): warps of 32 rows (Note [Query rows a warp owns], Note [Key
// rows a warp owns]), dQ's 16-key chunks with Q and dO held (Note [Keys in chunks for dQ]).
TEST(TensorCoreFlashEmulated, HeadSize64) {
  run_bf16({2, 70, 2, 2, 64}, 37);    // a partial second tile (the harness's GPT-2 row)
  run_f16({1, 64, 4, 2, 64}, 38);     // exactly one tile, groups of 2
  run_bf16({1, 128, 2, 1, 64}, 50);   // exactly one block of 128 rows, multi-query
  run_bf16({1, 257, 8, 2, 64}, 46);   // one past two blocks, groups of 4
  run_bf16({1, 300, 4, 2, 64}, 45);   // a third block, its second span of 32 rows partial
}

// Head sizes 16 and 32: the same 32-row warps with fewer columns.
TEST(TensorCoreFlashEmulated, HeadSizes16And32) {
  run_f16({2, 63, 2, 1, 32}, 40);     // multi-query, one short of a tile
  run_f16({2, 160, 4, 4, 32}, 47);    // one block and a quarter
  run_bf16({1, 100, 2, 2, 16}, 41);   // the smallest head size it takes
  run_f16({1, 33, 3, 1, 16}, 51);     // one past the first warp's span, groups of 3
}

// Head sizes 96 and 128: warps of 16 rows, K and V read from shared memory.
TEST(TensorCoreFlashEmulated, HeadSizes96And128) {
  run_bf16({1, 65, 3, 3, 96}, 42);    // one past a tile
  run_bf16({1, 129, 6, 2, 128}, 39);  // LLaMA-7B's head size, groups of 3
  run_f16({1, 80, 2, 1, 128}, 52);
}

}  // namespace
}  // namespace zerone::cuda
