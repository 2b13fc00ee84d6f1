// Note [Fast math in the CPU kernels]: this file is compiled with -ffast-math so that GCC vectorizes
// expf/tanhf through glibc's libmvec and reassociates the row reductions (LayerNorm, softmax) into
// SIMD lanes. Without it GELU alone costs ~0.15 s per GPT-2 124M step. Nothing here tests for NaN
// or inf; the trainer checks the loss for non-finite values in a normally compiled file. The
// finite-difference and PyTorch golden tests hold these kernels to their tolerances.
#include "zerone/kernels/cpu/ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/core/memory.h"
#include "zerone/core/profiler.h"
#include "zerone/kernels/cpu/matmul.h"

namespace zerone::kernels::cpu {
namespace {

// Parameter storage by dtype: the C++ type and how to widen an element to f32. (bf16 and f16 share
// uint16_t storage, so the dtype, not the C++ type, selects the conversion.)
template <DType D> struct Param;
// store() rounds to nearest even (core/dtype.h).
template <> struct Param<DType::f32> {
  using type = float;
  static float load(const float* p, size_t i) { return p[i]; }
  static void store(float* p, size_t i, float x) { p[i] = x; }
};
template <> struct Param<DType::bf16> {
  using type = uint16_t;
  static float load(const uint16_t* p, size_t i) { return bf16_to_f32(p[i]); }
  static void store(uint16_t* p, size_t i, float x) { p[i] = f32_to_bf16(x); }
};
template <> struct Param<DType::f16> {
  using type = uint16_t;
  static float load(const uint16_t* p, size_t i) { return f16_to_f32(p[i]); }
  static void store(uint16_t* p, size_t i, float x) { p[i] = f32_to_f16(x); }
};

// Runs `body` with a Param<dtype> tag.
template <typename Body>
void with_param_type(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::f32: body(Param<DType::f32>{}); return;
    case DType::bf16: body(Param<DType::bf16>{}); return;
    case DType::f16: body(Param<DType::f16>{}); return;
  }
}

// Note [Scratch arena]: kernels need temporaries (bf16 copies of matmul inputs, per-thread partial
// sums). Each slot keeps one buffer that only grows, so after the first step nothing is allocated.
// The buffers are host memory (default_arena()) counted as device scratch: these kernels run on
// host memory whichever device they serve (the sim backend runs them on its host view).
enum ScratchSlot { kScratchA, kScratchB, kScratchBias, kScratchPartials, kScratchWeight, kScratchKT, kScratchKVGradT, kScratchRows, kScratchRowsIn, kScratchOut, kScratchQkv, kScratchSlots };

void* scratch(ScratchSlot slot, size_t bytes) {
  static Buffer buffers[kScratchSlots];
  Buffer& buf = buffers[slot];
  if (buf.bytes() < bytes) buf = Buffer(bytes, MemCategory::scratch, MemPlace::device, 64, default_arena());
  return buf.data();
}

// Elements at..at+n-1 of `out` (of `dtype`) = row[0..n) rounded to nearest even with core/dtype.h's
// conversions (activation_operand's); an f32 out gets a copy, unless row is already there.
void store_rounded(void* out, DType dtype, size_t at, const float* row, size_t n) {
  switch (dtype) {
    case DType::f32: {
      float* o = static_cast<float*>(out) + at;
      if (o != row) std::memcpy(o, row, sizeof(float) * n);
      return;
    }
    case DType::bf16: {
      bf16_t* o = static_cast<bf16_t*>(out) + at;
#pragma omp simd
      for (size_t i = 0; i < n; ++i) o[i] = f32_to_bf16(row[i]);
      return;
    }
    case DType::f16: {
      f16_t* o = static_cast<f16_t*>(out) + at;
      for (size_t i = 0; i < n; ++i) o[i] = f32_to_f16(row[i]);
      return;
    }
  }
}

// Where an op writes its output rows (Note [GEMM operands in the compute dtype], kernels/
// backend.h): with an f32 out_dtype straight into `out`; otherwise each row is computed in f32 in
// the calling thread's slot of kScratchRows and then rounded into `out` by store(), with the
// conversions of core/dtype.h that activation_operand uses, so a GEMM reading the stored row sees
// the bits it would have made from the f32 one. Built outside the parallel region (it takes the
// scratch); row() and store() are called inside it, each thread for its own rows.
class RowOut {
 public:
  RowOut(void* out, DType dtype, size_t row_numel) : out_(out), dtype_(dtype), row_numel_(row_numel) {
    if (dtype != DType::f32)
      rows_ = static_cast<float*>(scratch(kScratchRows, sizeof(float) * row_numel * omp_get_max_threads()));
  }
  // Where the row whose first element is element `at` of out is computed (row_numel floats).
  float* row(size_t at) const {
    return dtype_ == DType::f32 ? static_cast<float*>(out_) + at : rows_ + omp_get_thread_num() * row_numel_;
  }
  // Stores the n values computed at `row` (from row(at)) as elements at.. of out (f32: computed in
  // place already).
  void store(size_t at, const float* row, size_t n) const { store_rounded(out_, dtype_, at, row, n); }

 private:
  void* out_;
  DType dtype_;
  size_t row_numel_;
  float* rows_ = nullptr;
};

// RowOut's counterpart for an op's input rows (Note [The MLP's hidden activation in the compute
// dtype], kernels/backend.h): with an f32 dtype row() points into `inp`; otherwise it widens the
// row exactly (core/dtype.h's conversions) into the calling thread's slot of kScratchRowsIn and
// points there, valid until that thread's next row(). Built outside the parallel region (it takes
// the scratch); row() is called inside it.
class RowIn {
 public:
  RowIn(const void* inp, DType dtype, size_t row_numel) : inp_(inp), dtype_(dtype), row_numel_(row_numel) {
    if (dtype != DType::f32)
      rows_ = static_cast<float*>(scratch(kScratchRowsIn, sizeof(float) * row_numel * omp_get_max_threads()));
  }
  // Elements at..at+n-1 of inp as f32 (n <= row_numel).
  const float* row(size_t at, size_t n) const {
    if (dtype_ == DType::f32) return static_cast<const float*>(inp_) + at;
    float* r = rows_ + omp_get_thread_num() * row_numel_;
    const uint16_t* x = static_cast<const uint16_t*>(inp_) + at;
    if (dtype_ == DType::bf16) {
#pragma omp simd
      for (size_t i = 0; i < n; ++i) r[i] = bf16_to_f32(x[i]);
    } else {
      for (size_t i = 0; i < n; ++i) r[i] = f16_to_f32(x[i]);
    }
    return r;
  }

 private:
  const void* inp_;
  DType dtype_;
  size_t row_numel_;
  float* rows_ = nullptr;
};

// Note [fp16 on the CPU]: oneDNN 2.6 has no f16 matmul on CPUs without AVX512-FP16, so fp16 runs
// its GEMMs in f32 on operands rounded to f16: the weights are f16 already (widened exactly), the
// activation and gradient operands are rounded to f16 and back. The rounding, the range and so
// the overflow behaviour that loss scaling exists for are those of fp16; only the speed is not.
// Operands already stored in f16 (Note [GEMM operands in the compute dtype]) are widened to f32
// scratch likewise, exactly: on the cpu they save the rounding pass, not the scratch.

// A matmul operand: its data and the dtype the GEMM reads it in.
struct Operand {
  const void* data;
  DType dtype;
};

// The GEMM dtype for parameters stored as `param_dtype`.
DType gemm_dtype(DType param_dtype) { return param_dtype == DType::f16 ? DType::f32 : param_dtype; }

// `src` (n activations or gradients, f32 or already rounded to `param_dtype`: Note [GEMM operands
// in the compute dtype]) as a matmul operand for `param_dtype`.
Operand activation_operand(const void* src, DType src_dtype, size_t n, DType param_dtype, ScratchSlot slot) {
  ZERONE_ASSERT(src_dtype == DType::f32 || src_dtype == param_dtype, "a ", dtype_name(src_dtype),
                " GEMM operand for ", dtype_name(param_dtype), " weights");
  switch (param_dtype) {
    case DType::f32: return {src, DType::f32};
    case DType::bf16: {
      if (src_dtype == DType::bf16) return {src, DType::bf16};
      void* dst = scratch(slot, n * 2);
      convert_f32_to_bf16(static_cast<const float*>(src), static_cast<bf16_t*>(dst), n);
      return {dst, DType::bf16};
    }
    case DType::f16: {
      float* dst = static_cast<float*>(scratch(slot, n * 4));
      if (src_dtype == DType::f16) {
        convert_f16_to_f32(static_cast<const f16_t*>(src), dst, n);
        return {dst, DType::f32};
      }
      const float* x = static_cast<const float*>(src);
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(f32_to_f16(x[i]));
      return {dst, DType::f32};
    }
  }
  ZERONE_ASSERT(false);
}

// A weight (n elements stored as `param_dtype`) as a matmul operand.
Operand weight_operand(const void* weight, size_t n, DType param_dtype) {
  if (param_dtype != DType::f16) return {weight, param_dtype};
  float* dst = static_cast<float*>(scratch(kScratchWeight, n * 4));
  convert_f16_to_f32(static_cast<const f16_t*>(weight), dst, n);
  return {dst, DType::f32};
}

}  // namespace

// ---------------------------------------------------------------- embedding

void embedding_forward(float* out, const int32_t* tokens, const void* wte, const void* wpe, DType param_dtype,
                       int B, int T, int C) {
  ProfileScope profile(ProfileCategory::elementwise);
  with_param_type(param_dtype, [&](auto tag) {
    using PT = decltype(tag);
    using P = typename PT::type;
    const P* wte_p = static_cast<const P*>(wte);
    const P* wpe_p = static_cast<const P*>(wpe);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        float* out_bt = out + (static_cast<size_t>(b) * T + t) * C;  // (C)
        size_t tok_off = static_cast<size_t>(tokens[b * T + t]) * C;
        size_t pos_off = static_cast<size_t>(t) * C;
        if (wpe_p == nullptr) {  // no position table (LLaMA: positions enter through RoPE)
#pragma omp simd
          for (int i = 0; i < C; ++i) out_bt[i] = PT::load(wte_p, tok_off + i);
          continue;
        }
#pragma omp simd
        for (int i = 0; i < C; ++i) out_bt[i] = PT::load(wte_p, tok_off + i) + PT::load(wpe_p, pos_off + i);
      }
    }
  });
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  ProfileScope profile(ProfileCategory::elementwise);
  // Parallel over channel blocks: tokens repeat, so rows of dwte would race; columns never do.
#pragma omp parallel
  {
    int nthreads = omp_get_num_threads(), tid = omp_get_thread_num();
    int per = (C + nthreads - 1) / nthreads;
    int c0 = std::min(C, tid * per), c1 = std::min(C, c0 + per);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const float* dout_bt = dout + (static_cast<size_t>(b) * T + t) * C;
        float* dwte_row = dwte + static_cast<size_t>(tokens[b * T + t]) * C;
        if (dwpe == nullptr) {
#pragma omp simd
          for (int i = c0; i < c1; ++i) dwte_row[i] += dout_bt[i];
          continue;
        }
        float* dwpe_row = dwpe + static_cast<size_t>(t) * C;
#pragma omp simd
        for (int i = c0; i < c1; ++i) {
          dwte_row[i] += dout_bt[i];
          dwpe_row[i] += dout_bt[i];
        }
      }
    }
  }
}

// ---------------------------------------------------------------- layernorm

void layernorm_forward(void* out, DType out_dtype, float* mean, float* rstd, const float* inp, const void* weight,
                       const void* bias, DType param_dtype, int N, int C) {
  ProfileScope profile(ProfileCategory::elementwise);
  const float eps = 1e-5f;
  const RowOut rows(out, out_dtype, C);
  with_param_type(param_dtype, [&](auto tag) {
    using PT = decltype(tag);
    using P = typename PT::type;
    const P* w = static_cast<const P*>(weight);
    const P* bs = static_cast<const P*>(bias);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<size_t>(n) * C;  // (C)
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < C; ++i) sum += x[i];
      float m = sum / C;
      float var = 0.0f;
#pragma omp simd reduction(+ : var)
      for (int i = 0; i < C; ++i) var += (x[i] - m) * (x[i] - m);
      float s = 1.0f / std::sqrt(var / C + eps);
      float* o = rows.row(static_cast<size_t>(n) * C);
#pragma omp simd
      for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * PT::load(w, i) + PT::load(bs, i);
      rows.store(static_cast<size_t>(n) * C, o, C);
      mean[n] = m;
      rstd[n] = s;
    }
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const void* weight, DType param_dtype, const float* mean, const float* rstd, int N,
                        int C) {
  ProfileScope profile(ProfileCategory::elementwise);
  int max_threads = omp_get_max_threads();
  // Per-thread partial sums of dweight and dbias, reduced at the end: (threads, 2C)
  float* partials = static_cast<float*>(scratch(kScratchPartials, sizeof(float) * 2 * C * max_threads));
  std::memset(partials, 0, sizeof(float) * 2 * C * max_threads);
  int used_threads = 1;
  with_param_type(param_dtype, [&](auto tag) {
    using PT = decltype(tag);
    using P = typename PT::type;
    const P* w = static_cast<const P*>(weight);
#pragma omp parallel
    {
#pragma omp single
      used_threads = omp_get_num_threads();
      float* dw_part = partials + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
      float* db_part = dw_part + C;
#pragma omp for schedule(static)
      for (int n = 0; n < N; ++n) {
        const float* x = inp + static_cast<size_t>(n) * C;
        const float* dy = dout + static_cast<size_t>(n) * C;
        float* dx = dinp + static_cast<size_t>(n) * C;
        float m = mean[n], s = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
        for (int i = 0; i < C; ++i) {
          float norm = (x[i] - m) * s;
          float dnorm = PT::load(w, i) * dy[i];
          dnorm_mean += dnorm;
          dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
#pragma omp simd
        for (int i = 0; i < C; ++i) {
          float norm = (x[i] - m) * s;
          float dnorm = PT::load(w, i) * dy[i];
          db_part[i] += dy[i];
          dw_part[i] += norm * dy[i];
          dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
      }
    }
  });
  for (int t = 0; t < used_threads; ++t) {
    const float* dw_part = partials + static_cast<size_t>(t) * 2 * C;
    for (int i = 0; i < C; ++i) {
      dweight[i] += dw_part[i];
      dbias[i] += dw_part[C + i];
    }
  }
}

// ---------------------------------------------------------------- linear

void linear_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, const void* weight, const void* bias,
                    DType param_dtype, int N, int C, int OC) {
  ZERONE_ASSERT(out_dtype == DType::f32 || out_dtype == param_dtype, "a ", dtype_name(out_dtype), " output for ",
                dtype_name(param_dtype), " weights");
  ProfileScope profile(ProfileCategory::elementwise);
  const float* bias_f32 = nullptr;
  if (bias != nullptr) {
    if (param_dtype == DType::f32) {
      bias_f32 = static_cast<const float*>(bias);
    } else {
      float* tmp = static_cast<float*>(scratch(kScratchBias, sizeof(float) * OC));
      convert_to_f32(bias, param_dtype, tmp, OC);
      bias_f32 = tmp;
    }
  }
  Operand x = activation_operand(inp, inp_dtype, static_cast<size_t>(N) * C, param_dtype, kScratchA);
  Operand w = weight_operand(weight, static_cast<size_t>(OC) * C, param_dtype);
  // weight is stored (OC, C): op(B) = weight^T (C, OC)
  const DType gemm = gemm_dtype(param_dtype);
  if (out_dtype == DType::f32) {
    matmul(x.data, false, w.data, true, static_cast<float*>(out), N, OC, C, gemm, /*accumulate=*/false, bias_f32);
  } else if (gemm == DType::bf16) {
    matmul_bf16_out(x.data, false, w.data, true, out, N, OC, C, bias_f32);
  } else {  // f16 (Note [fp16 on the CPU]): the f32 GEMM, then rounded
    const size_t numel = static_cast<size_t>(N) * OC;
    float* wide = static_cast<float*>(scratch(kScratchOut, sizeof(float) * numel));
    matmul(x.data, false, w.data, true, wide, N, OC, C, gemm, /*accumulate=*/false, bias_f32);
    convert_from_f32(wide, out, out_dtype, numel);
  }
}

void linear_backward(float* dinp, float* dweight, float* dbias, const void* dout, DType dout_dtype, const void* inp,
                     DType inp_dtype, const void* weight, DType param_dtype, int N, int C, int OC,
                     bool accumulate_param_grads) {
  ProfileScope profile(ProfileCategory::elementwise);
  ZERONE_ASSERT(dbias == nullptr || dout_dtype == DType::f32, "the bias gradient sums dout in f32");
  const DType gemm = gemm_dtype(param_dtype);
  Operand dy = activation_operand(dout, dout_dtype, static_cast<size_t>(N) * OC, param_dtype, kScratchA);
  if (dinp != nullptr) {
    Operand w = weight_operand(weight, static_cast<size_t>(OC) * C, param_dtype);
    matmul(dy.data, false, w.data, false, dinp, N, C, OC, gemm, /*accumulate=*/false);  // (N,OC)@(OC,C)
  }
  Operand x = activation_operand(inp, inp_dtype, static_cast<size_t>(N) * C, param_dtype, kScratchB);
  matmul(dy.data, true, x.data, false, dweight, OC, C, N, gemm, accumulate_param_grads);  // (OC,N)@(N,C)
  if (dbias != nullptr) {
    if (!accumulate_param_grads) std::memset(dbias, 0, static_cast<size_t>(OC) * sizeof(float));
#pragma omp parallel
    {
      int nthreads = omp_get_num_threads(), tid = omp_get_thread_num();
      int per = (OC + nthreads - 1) / nthreads;
      int o0 = std::min(OC, tid * per), o1 = std::min(OC, o0 + per);
      for (int n = 0; n < N; ++n) {
        const float* dy = static_cast<const float*>(dout) + static_cast<size_t>(n) * OC;
#pragma omp simd
        for (int o = o0; o < o1; ++o) dbias[o] += dy[o];
      }
    }
  }
}

// ---------------------------------------------------------------- attention

// Note [Attention as batched GEMMs]: per (batch, head) the score matrix Q K^T (T,T), the output
// P V (T,hs) and the four backward products are small GEMMs; oneDNN runs them as one strided
// batched matmul each, straight out of the interleaved (B,T,3C) qkv layout. The full T x T square is
// multiplied (twice the causal FLOPs) because the GEMM is >10x faster than masked dot-product loops;
// the causal mask is applied in the softmax, which writes exact zeros above the diagonal so every
// product that follows ignores the future.
// Note [Grouped-query attention as strided GEMMs]: query head h = kv*G + g (G = NH/NKV) reads kv
// head kv. For each g, the (b, kv) pairs form one strided batch: Q_g starts at g*hs with a head
// stride of G*hs, K and V at their own offsets with a head stride of hs, att's head stride is G*T*T.
// So each of the G passes is one oneDNN batched GEMM and nothing is copied or repeated; dK and dV
// accumulate over the G passes. With G = 1 (GPT-2) this is exactly one pass.
namespace {

// Note [Attention without transposed GEMM operands]: oneDNN 2.6's f32 batched matmul runs 2-4x
// slower when an operand is a transposed strided view (column stride != 1): at the W6 shape
// (T 256, hs 64) Q @ K^T took 1.48 ms against 0.56 ms with K^T materialized, and P^T @ dO 2.6 ms
// against 0.67 ms for (dO^T @ P), its transpose with unit-stride rows. So K^T and V^T are copied
// out (B*NKV*hs*T floats, a fraction of the (B,NH,T,T) scores), and dV, dK are computed
// transposed, (hs, T) = dO^T @ P and Q^T @ dS, and copied back into dqkv. The sums are the same
// products in the GEMM's own order: results agree with the transposed-operand form to rounding.

// dst(b0, b1, i, j) = src(b0, b1, i, j) for i < rows, j < cols, through two strided views: with a
// view whose row and column strides are swapped this is a batched transpose. Tiled so that both
// sides are read and written in cache-line runs.
void copy_views(float* dst, Strides4 d, const float* src, Strides4 s, int64_t n0, int64_t n1, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 16;
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t b = 0; b < n0 * n1; ++b)
    for (int64_t ti = 0; ti < row_tiles; ++ti)
      for (int64_t tj = 0; tj < col_tiles; ++tj) {
        const int64_t b0 = b / n1, b1 = b % n1;
        float* dm = dst + b0 * d.batch0 + b1 * d.batch1;
        const float* sm = src + b0 * s.batch0 + b1 * s.batch1;
        for (int64_t i = ti * kTile; i < std::min(rows, (ti + 1) * kTile); ++i)
          for (int64_t j = tj * kTile; j < std::min(cols, (tj + 1) * kTile); ++j)
            dm[i * d.row + j * d.col] = sm[i * s.row + j * s.col];
      }
}

}  // namespace

void gqa_attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int NKV, int hs) {
  ProfileScope profile(ProfileCategory::attention);
  ZERONE_ASSERT(NKV >= 1 && NH % NKV == 0, "NH ", NH, " is not a multiple of NKV ", NKV);
  const int64_t G = NH / NKV, R = static_cast<int64_t>(NH + 2 * NKV) * hs, TT = static_cast<int64_t>(T) * T;
  const int64_t out_row = static_cast<int64_t>(NH) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const Strides4 q_rows{T * R, G * hs, R, 1};                 // Q of heads kv*G+g: (T, hs)
  const Strides4 kv_rows{T * R, hs, R, 1};                    // K or V of head kv: (T, hs)
  const Strides4 kv_t{NKV * hs * T, hs * T, T, 1};            // a copy of K^T of head kv: (hs, T)
  const Strides4 kv_t_as_rows{NKV * hs * T, hs * T, 1, T};    // the same copy indexed (t, d)
  const Strides4 att_rows{NH * TT, G * TT, T, 1};             // (T, T) of head kv*G+g
  const Strides4 out_rows{T * out_row, G * hs, out_row, 1};   // (T, hs) of head kv*G+g
  const float* k = qkv + static_cast<int64_t>(NH) * hs;
  const float* v = k + static_cast<int64_t>(NKV) * hs;
  // Note [Attention without transposed GEMM operands]
  float* kt = static_cast<float*>(scratch(kScratchKT, sizeof(float) * B * NKV * hs * T));  // (B,NKV,hs,T)
  copy_views(kt, kv_t_as_rows, k, kv_rows, B, NKV, T, hs);
  // att (B,NH,T,T) = scale * Q @ K^T
  for (int64_t g = 0; g < G; ++g)
    batched_matmul(B, NKV, T, T, hs, qkv + g * hs, q_rows, kt, kv_t, att + g * TT, att_rows, DType::f32, scale, false);
  // causal softmax over each row's first t+1 columns, zeros after
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < static_cast<int64_t>(B) * NH * T; ++row) {
    const int t = static_cast<int>(row % T);
    float* r = att + row * T;
    float maxval = -1e30f;
    for (int t2 = 0; t2 <= t; ++t2) maxval = std::max(maxval, r[t2]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int t2 = 0; t2 <= t; ++t2) {
      float e = std::exp(r[t2] - maxval);
      r[t2] = e;
      sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int t2 = 0; t2 <= t; ++t2) r[t2] *= inv;
    for (int t2 = t + 1; t2 < T; ++t2) r[t2] = 0.0f;
  }
  // out (B,T,NH*hs) viewed as (B,NH,T,hs) = P @ V
  for (int64_t g = 0; g < G; ++g)
    batched_matmul(B, NKV, T, hs, T, att + g * TT, att_rows, v, kv_rows, out + g * hs, out_rows, DType::f32, 1.0f,
                   false);
}

void gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int NH,
                            int NKV, int hs) {
  ProfileScope profile(ProfileCategory::attention);
  ZERONE_ASSERT(NKV >= 1 && NH % NKV == 0, "NH ", NH, " is not a multiple of NKV ", NKV);
  const int64_t G = NH / NKV, R = static_cast<int64_t>(NH + 2 * NKV) * hs, TT = static_cast<int64_t>(T) * T;
  const int64_t out_row = static_cast<int64_t>(NH) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const Strides4 q_rows{T * R, G * hs, R, 1};
  const Strides4 q_rows_t{T * R, G * hs, 1, R};              // Q^T of heads kv*G+g: (hs, T)
  const Strides4 kv_rows{T * R, hs, R, 1};
  const Strides4 kv_t{NKV * hs * T, hs * T, T, 1};           // a contiguous (hs, T) per kv head
  const Strides4 kv_t_as_rows{NKV * hs * T, hs * T, 1, T};
  const Strides4 att_rows{NH * TT, G * TT, T, 1};
  const Strides4 out_rows{T * out_row, G * hs, out_row, 1};
  const Strides4 out_rows_t{T * out_row, G * hs, 1, out_row};  // dO^T of heads kv*G+g: (hs, T)
  const float* k = qkv + static_cast<int64_t>(NH) * hs;
  const float* v = k + static_cast<int64_t>(NKV) * hs;
  float* dk = dqkv + static_cast<int64_t>(NH) * hs;
  float* dv = dk + static_cast<int64_t>(NKV) * hs;
  float* datt = static_cast<float*>(scratch(kScratchPartials, sizeof(float) * B * NH * TT));  // (B,NH,T,T)
  // Note [Attention without transposed GEMM operands]: V^T copied out; dV^T and dK^T computed.
  float* vt = static_cast<float*>(scratch(kScratchKT, sizeof(float) * B * NKV * hs * T));        // (B,NKV,hs,T)
  float* dkv_t = static_cast<float*>(scratch(kScratchKVGradT, sizeof(float) * B * NKV * hs * T));  // (B,NKV,hs,T)
  copy_views(vt, kv_t_as_rows, v, kv_rows, B, NKV, T, hs);
  // dP = dO @ V^T ; dV^T = sum over the group of dO^T @ P
  for (int64_t g = 0; g < G; ++g) {
    batched_matmul(B, NKV, T, T, hs, dout + g * hs, out_rows, vt, kv_t, datt + g * TT, att_rows, DType::f32, 1.0f, false);
    batched_matmul(B, NKV, hs, T, T, dout + g * hs, out_rows_t, att + g * TT, att_rows, dkv_t, kv_t, DType::f32, 1.0f,
                   g > 0);
  }
  copy_views(dv, kv_rows, dkv_t, kv_t_as_rows, B, NKV, T, hs);
  // dS = P * (dP - sum_j P dP) row by row (zero above the diagonal since P is)
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < static_cast<int64_t>(B) * NH * T; ++row) {
    const int t = static_cast<int>(row % T);
    const float* p = att + row * T;
    float* d = datt + row * T;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int t2 = 0; t2 <= t; ++t2) dot += p[t2] * d[t2];
#pragma omp simd
    for (int t2 = 0; t2 <= t; ++t2) d[t2] = p[t2] * (d[t2] - dot);
    for (int t2 = t + 1; t2 < T; ++t2) d[t2] = 0.0f;
  }
  // dQ = scale * dS @ K ; dK^T = scale * sum over the group of Q^T @ dS
  for (int64_t g = 0; g < G; ++g) {
    batched_matmul(B, NKV, T, hs, T, datt + g * TT, att_rows, k, kv_rows, dqkv + g * hs, q_rows, DType::f32, scale,
                   false);
    batched_matmul(B, NKV, hs, T, T, qkv + g * hs, q_rows_t, datt + g * TT, att_rows, dkv_t, kv_t, DType::f32, scale,
                   g > 0);
  }
  copy_views(dk, kv_rows, dkv_t, kv_t_as_rows, B, NKV, T, hs);
}

// Note [Attention's inputs and output in the compute dtype] (kernels/backend.h) on the cpu: a
// 16-bit qkv is widened exactly into scratch and the f32 kernels above run on it; out is computed
// in f32 scratch and stored rounded.
namespace {
const float* widened_qkv(const void* qkv, DType dtype, size_t n) {
  if (dtype == DType::f32) return static_cast<const float*>(qkv);
  float* wide = static_cast<float*>(scratch(kScratchQkv, sizeof(float) * n));
  convert_to_f32(qkv, dtype, wide, n);
  return wide;
}
}  // namespace

void gqa_attention_forward_stored(void* out, float* att, const void* qkv, DType dtype, int B, int T, int NH, int NKV,
                                  int hs) {
  const size_t BT = static_cast<size_t>(B) * T, qkv_n = BT * (NH + 2 * NKV) * hs, out_n = BT * NH * hs;
  const float* q32 = widened_qkv(qkv, dtype, qkv_n);
  if (dtype == DType::f32) return gqa_attention_forward(static_cast<float*>(out), att, q32, B, T, NH, NKV, hs);
  float* o32 = static_cast<float*>(scratch(kScratchOut, sizeof(float) * out_n));
  gqa_attention_forward(o32, att, q32, B, T, NH, NKV, hs);
  convert_from_f32(o32, out, dtype, out_n);
}

void gqa_attention_backward_stored(float* dqkv, const float* dout, const void* qkv, DType dtype, const float* att,
                                   int B, int T, int NH, int NKV, int hs) {
  const size_t qkv_n = static_cast<size_t>(B) * T * (NH + 2 * NKV) * hs;
  gqa_attention_backward(dqkv, dout, widened_qkv(qkv, dtype, qkv_n), att, B, T, NH, NKV, hs);
}

// ---------------------------------------------------------------- rmsnorm

void rmsnorm_forward(void* out, DType out_dtype, float* rstd, const float* inp, const void* weight,
                     DType param_dtype, int N, int C, float eps) {
  ProfileScope profile(ProfileCategory::elementwise);
  const RowOut rows(out, out_dtype, C);
  with_param_type(param_dtype, [&](auto tag) {
    using PT = decltype(tag);
    using P = typename PT::type;
    const P* w = static_cast<const P*>(weight);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<size_t>(n) * C;  // (C)
      float sumsq = 0.0f;
#pragma omp simd reduction(+ : sumsq)
      for (int i = 0; i < C; ++i) sumsq += x[i] * x[i];
      float s = 1.0f / std::sqrt(sumsq / C + eps);
      float* o = rows.row(static_cast<size_t>(n) * C);
#pragma omp simd
      for (int i = 0; i < C; ++i) o[i] = x[i] * s * PT::load(w, i);
      rows.store(static_cast<size_t>(n) * C, o, C);
      rstd[n] = s;
    }
  });
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const void* weight,
                      DType param_dtype, const float* rstd, int N, int C, void* dinp_rounded, DType rounded_dtype) {
  ProfileScope profile(ProfileCategory::elementwise);
  int max_threads = omp_get_max_threads();
  // Per-thread partial sums of dweight, reduced at the end: (threads, C)
  float* partials = static_cast<float*>(scratch(kScratchPartials, sizeof(float) * C * max_threads));
  std::memset(partials, 0, sizeof(float) * C * max_threads);
  int used_threads = 1;
  with_param_type(param_dtype, [&](auto tag) {
    using PT = decltype(tag);
    using P = typename PT::type;
    const P* w = static_cast<const P*>(weight);
#pragma omp parallel
    {
#pragma omp single
      used_threads = omp_get_num_threads();
      float* dw_part = partials + static_cast<size_t>(omp_get_thread_num()) * C;
      const auto backward_row = [&](int n) {
        const float* x = inp + static_cast<size_t>(n) * C;
        const float* dy = dout + static_cast<size_t>(n) * C;
        float* dx = dinp + static_cast<size_t>(n) * C;
        const float s = rstd[n];
        // d/dx of x*s: s * (g - xhat * mean(g * xhat)) with g = w * dy, xhat = x * s
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int i = 0; i < C; ++i) dot += PT::load(w, i) * dy[i] * x[i] * s;
        dot /= C;
#pragma omp simd
        for (int i = 0; i < C; ++i) {
          float xhat = x[i] * s;
          dw_part[i] += xhat * dy[i];
          dx[i] += s * (PT::load(w, i) * dy[i] - xhat * dot);
        }
      };
      // Two loops, so that the common one is compiled as it was before the rounded copy existed
      // (an f32 run's bits do not move with it).
      if (!dinp_rounded) {
#pragma omp for schedule(static)
        for (int n = 0; n < N; ++n) backward_row(n);
      } else {
#pragma omp for schedule(static)
        for (int n = 0; n < N; ++n) {
          backward_row(n);
          // Note [Gradients rounded where they are made]: the row's sum, rounded as convert would.
          store_rounded(dinp_rounded, rounded_dtype, static_cast<size_t>(n) * C, dinp + static_cast<size_t>(n) * C, C);
        }
      }
    }
  });
  for (int t = 0; t < used_threads; ++t) {
    const float* dw_part = partials + static_cast<size_t>(t) * C;
    for (int i = 0; i < C; ++i) dweight[i] += dw_part[i];
  }
}

// ---------------------------------------------------------------- rotary embeddings


namespace {

constexpr int kRopeMaxHalf = 1024;

// Position t's table: cos and sign * sin of t * inv_freq[i] for i < half (as Hugging Face: the
// angle is formed in f32, then cos and sin of it).
void rope_table(int t, const float* inv_freq, int half, float sign, float* cos_t, float* sin_t) {
  for (int i = 0; i < half; ++i) {
    float angle = static_cast<float>(t) * inv_freq[i];
    cos_t[i] = std::cos(angle);
    sin_t[i] = sign * std::sin(angle);
  }
}

// Rotates the first `heads` head vectors of one row in place by the table: each element rotated in
// f32 and stored rounded to PT's dtype. One body for every caller, so that each rotates with the
// same arithmetic.
template <typename PT>
void rope_rotate_row(typename PT::type* row, const float* cos_t, const float* sin_t, int heads, int hs) {
  const int half = hs / 2;
  for (int h = 0; h < heads; ++h) {
    auto* v = row + static_cast<size_t>(h) * hs;
#pragma omp simd
    for (int i = 0; i < half; ++i) {
      float a = PT::load(v, i), c = PT::load(v, i + half);
      PT::store(v, i, a * cos_t[i] - c * sin_t[i]);
      PT::store(v, i + half, c * cos_t[i] + a * sin_t[i]);
    }
  }
}

// Rotates each of the first `heads` head vectors of every row by angle sign * t * inv_freq[i].
// x (B, T, stride) of PT's dtype: each element rotated in f32 and stored rounded to it.
template <typename PT>
void rope_rotate(typename PT::type* x, const float* inv_freq, int B, int T, int stride, int heads, int hs, float sign) {
  const int half = hs / 2;
  ZERONE_ASSERT(half <= kRopeMaxHalf, "rotary head size ", hs, " above ", 2 * kRopeMaxHalf);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t) {
    float cos_t[kRopeMaxHalf], sin_t[kRopeMaxHalf];
    rope_table(t, inv_freq, half, sign, cos_t, sin_t);
    for (int b = 0; b < B; ++b) rope_rotate_row<PT>(x + (static_cast<size_t>(b) * T + t) * stride, cos_t, sin_t, heads, hs);
  }
}

}  // namespace

void rope_forward(void* x, DType x_dtype, const float* inv_freq, int B, int T, int stride, int heads, int hs) {
  ProfileScope profile(ProfileCategory::elementwise);
  with_param_type(x_dtype, [&](auto tag) {
    using PT = decltype(tag);
    rope_rotate<PT>(static_cast<typename PT::type*>(x), inv_freq, B, T, stride, heads, hs, 1.0f);
  });
}

void rope_backward(float* dx, const float* inv_freq, int B, int T, int stride, int heads, int hs, void* dx_rounded,
                   DType rounded_dtype) {
  ProfileScope profile(ProfileCategory::elementwise);
  // The rotation is orthogonal: its transpose (the gradient map) is the rotation by -angle.
  if (!dx_rounded) return rope_rotate<Param<DType::f32>>(dx, inv_freq, B, T, stride, heads, hs, -1.0f);
  // Note [Gradients rounded where they are made]: each row copied into the calling thread's f32
  // row (RowOut's), rotated there by rope_rotate's own row body, then stored rounded whole; dx is
  // only read.
  const RowOut rows(dx_rounded, rounded_dtype, stride);
  const int half = hs / 2;
  ZERONE_ASSERT(half <= kRopeMaxHalf, "rotary head size ", hs, " above ", 2 * kRopeMaxHalf);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t) {
    float cos_t[kRopeMaxHalf], sin_t[kRopeMaxHalf];
    rope_table(t, inv_freq, half, -1.0f, cos_t, sin_t);
    for (int b = 0; b < B; ++b) {
      const size_t at = (static_cast<size_t>(b) * T + t) * stride;
      float* row = rows.row(at);
      if (row != dx + at) std::memcpy(row, dx + at, sizeof(float) * stride);
      rope_rotate_row<Param<DType::f32>>(row, cos_t, sin_t, heads, hs);
      rows.store(at, row, stride);
    }
  }
}

// ---------------------------------------------------------------- swiglu

void swiglu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, int N, int F) {
  ProfileScope profile(ProfileCategory::elementwise);
  const RowOut rows(out, out_dtype, F);
  const RowIn inputs(inp, inp_dtype, 2 * static_cast<size_t>(F));
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* gate = inputs.row(static_cast<size_t>(n) * 2 * F, 2 * static_cast<size_t>(F));
    const float* up = gate + F;
    float* o = rows.row(static_cast<size_t>(n) * F);
#pragma omp simd
    for (int i = 0; i < F; ++i) {
      float g = gate[i];
      o[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
    rows.store(static_cast<size_t>(n) * F, o, F);
  }
}

void swiglu_backward(void* dinp, DType dinp_dtype, const float* dout, const void* inp, DType inp_dtype, int N, int F) {
  ProfileScope profile(ProfileCategory::elementwise);
  const RowOut rows(dinp, dinp_dtype, 2 * static_cast<size_t>(F));
  const RowIn inputs(inp, inp_dtype, 2 * static_cast<size_t>(F));
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* gate = inputs.row(static_cast<size_t>(n) * 2 * F, 2 * static_cast<size_t>(F));
    const float* up = gate + F;
    const float* dy = dout + static_cast<size_t>(n) * F;
    float* dgate = rows.row(static_cast<size_t>(n) * 2 * F);
    float* dup = dgate + F;
#pragma omp simd
    for (int i = 0; i < F; ++i) {
      float g = gate[i];
      float sig = 1.0f / (1.0f + std::exp(-g));
      float silu = g * sig;
      dgate[i] = dy[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
      dup[i] = dy[i] * silu;
    }
    rows.store(static_cast<size_t>(n) * 2 * F, dgate, 2 * static_cast<size_t>(F));
  }
}

// ---------------------------------------------------------------- gelu, residual

static constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

// In blocks of kGeluBlock elements, whatever the dtypes: each element is computed in the same
// vector lane either way (Note [GEMM operands in the compute dtype]: the rounded output is the f32
// one rounded; a 16-bit input is widened exactly first).
constexpr size_t kGeluBlock = 4096;

// body(at, len) for each block of kGeluBlock elements of n (the last one shorter), in parallel.
template <typename Body>
void for_each_gelu_block(size_t n, Body&& body) {
  const size_t blocks = (n + kGeluBlock - 1) / kGeluBlock;
#pragma omp parallel for schedule(static)
  for (size_t blk = 0; blk < blocks; ++blk) body(blk * kGeluBlock, std::min(kGeluBlock, n - blk * kGeluBlock));
}

void gelu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, size_t n) {
  ProfileScope profile(ProfileCategory::elementwise);
  const RowOut rows(out, out_dtype, kGeluBlock);
  const RowIn inputs(inp, inp_dtype, kGeluBlock);
  for_each_gelu_block(n, [&](size_t at, size_t len) {
    const float* x = inputs.row(at, len);
    float* o = rows.row(at);
#pragma omp simd
    for (size_t i = 0; i < len; ++i) {
      float cube = 0.044715f * x[i] * x[i] * x[i];
      o[i] = 0.5f * x[i] * (1.0f + std::tanh(kGeluScale * (x[i] + cube)));
    }
    rows.store(at, o, len);
  });
}

void gelu_backward(float* dinp, const void* inp, DType inp_dtype, const float* dout, size_t n) {
  ProfileScope profile(ProfileCategory::elementwise);
  const RowIn inputs(inp, inp_dtype, kGeluBlock);
  for_each_gelu_block(n, [&](size_t at, size_t len) {
    const float* xs = inputs.row(at, len);
    const float* dy = dout + at;
    float* dx = dinp + at;  // may be dy: each element is read before it is written
#pragma omp simd
    for (size_t i = 0; i < len; ++i) {
      float x = xs[i];
      float cube = 0.044715f * x * x * x;
      float tanh_out = std::tanh(kGeluScale * (x + cube));
      float sech2 = 1.0f - tanh_out * tanh_out;
      float local_grad = 0.5f * (1.0f + tanh_out) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
      dx[i] = local_grad * dy[i];
    }
  });
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  ProfileScope profile(ProfileCategory::elementwise);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// ---------------------------------------------------------------- cross-entropy

void crossentropy_forward(float* losses, float* lse, const void* logits, DType logits_dtype, const int32_t* targets,
                          int N, int V, int Vp) {
  ProfileScope profile(ProfileCategory::elementwise);
  with_param_type(logits_dtype, [&](auto tag) {
    using PT = decltype(tag);
    using P = typename PT::type;
    const P* all = static_cast<const P*>(logits);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const P* row = all + static_cast<size_t>(n) * Vp;  // (Vp), only [0, V) counts
      float maxval = -1e30f;
#pragma omp simd reduction(max : maxval)
      for (int v = 0; v < V; ++v) maxval = std::max(maxval, PT::load(row, v));
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int v = 0; v < V; ++v) sum += std::exp(PT::load(row, v) - maxval);
      float l = maxval + std::log(sum);
      lse[n] = l;
      losses[n] = l - PT::load(row, targets[n]);
    }
  });
}

void crossentropy_backward(void* dlogits, DType dlogits_dtype, const void* logits, DType logits_dtype, const float* lse,
                           const int32_t* targets, float dloss, int N, int V, int Vp) {
  ProfileScope profile(ProfileCategory::elementwise);
  ZERONE_ASSERT(dlogits != logits || dlogits_dtype == logits_dtype, "dlogits (", dtype_name(dlogits_dtype),
                ") written over logits of another dtype (", dtype_name(logits_dtype), ")");
  const RowOut rows(dlogits, dlogits_dtype, Vp);
  with_param_type(logits_dtype, [&](auto tag) {
    using PT = decltype(tag);
    using P = typename PT::type;
    const P* all = static_cast<const P*>(logits);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const P* row = all + static_cast<size_t>(n) * Vp;
      float* drow = rows.row(static_cast<size_t>(n) * Vp);  // may be row itself (f32 in place)
      float l = lse[n];
#pragma omp simd
      for (int v = 0; v < V; ++v) drow[v] = std::exp(PT::load(row, v) - l) * dloss;
      for (int v = V; v < Vp; ++v) drow[v] = 0.0f;
      drow[targets[n]] -= dloss;
      rows.store(static_cast<size_t>(n) * Vp, drow, Vp);  // 16-bit: over the row, read in full above
    }
  });
}

}  // namespace zerone::kernels::cpu

namespace zerone::kernels {

void rope_inv_freq(float* inv_freq, int hs, float theta, const RopeScaling& scaling) {
  ZERONE_ASSERT(hs % 2 == 0, "rotary head size ", hs, " is odd");
  constexpr double kPi = 3.14159265358979323846;
  for (int i = 0; i < hs / 2; ++i) {
    // Hugging Face: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in f32.
    float f = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(hs));
    if (scaling.factor > 0.0f) {
      const float old_ctx = static_cast<float>(scaling.original_max_position);
      const float low_wavelen = old_ctx / scaling.low_freq_factor;
      const float high_wavelen = old_ctx / scaling.high_freq_factor;
      const float wavelen = static_cast<float>(2.0 * kPi) / f;
      if (wavelen > low_wavelen) {
        f = f / scaling.factor;
      } else if (wavelen >= high_wavelen) {
        const float smooth = (old_ctx / wavelen - scaling.low_freq_factor) /
                             (scaling.high_freq_factor - scaling.low_freq_factor);
        f = (1.0f - smooth) * f / scaling.factor + smooth * f;
      }
    }
    inv_freq[i] = f;
  }
}

}  // namespace zerone::kernels
