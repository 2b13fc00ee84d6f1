#include "zerone/kernels/cpu/matmul.h"

#include <algorithm>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"
#include "zerone/kernels/cpu/onednn.h"

namespace zerone::kernels::cpu {
namespace {

using dnnl::memory;

using Context = OneDnn;
Context& context() { return onednn(); }

// Everything that shapes a primitive. A 2-D matmul is the 1 x 1 batch.
struct Shape {
  int64_t batch0, batch1, m, n, k;
  Strides4 a, b, c;
  DType dtype;
  float alpha;
  bool accumulate, has_bias;
  DType c_dtype = DType::f32;  // f32, or bf16 (matmul_bf16_out)
  auto tie() const {
    return std::tie(batch0, batch1, m, n, k, a, b, c, dtype, alpha, accumulate, has_bias, c_dtype);
  }
  bool operator<(const Shape& o) const { return tie() < o.tie(); }
};

struct Entry {
  dnnl::matmul primitive;
  memory::desc a_md, b_md, c_md, bias_md;
};

// Creates the primitive for `s` once (milliseconds) and caches it; locked, so callers may race.
Entry& lookup(const Shape& s) {
  static std::mutex mutex;
  static std::map<Shape, Entry> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(s);
  if (it != cache.end()) return it->second;
  memory::data_type dt = to_dnnl(s.dtype);
  memory::desc a_md({s.batch0, s.batch1, s.m, s.k}, dt, {s.a.batch0, s.a.batch1, s.a.row, s.a.col});
  memory::desc b_md({s.batch0, s.batch1, s.k, s.n}, dt, {s.b.batch0, s.b.batch1, s.b.row, s.b.col});
  memory::desc c_md({s.batch0, s.batch1, s.m, s.n}, to_dnnl(s.c_dtype), {s.c.batch0, s.c.batch1, s.c.row, s.c.col});
  memory::desc bias_md;
  if (s.has_bias) bias_md = memory::desc({1, 1, 1, s.n}, memory::data_type::f32, {s.n, s.n, s.n, 1});
  dnnl::primitive_attr attr;
  if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});
  if (s.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  auto desc = s.has_bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md) : dnnl::matmul::desc(a_md, b_md, c_md);
  dnnl::matmul::primitive_desc pd(desc, attr, context().engine);
  return cache.emplace(s, Entry{dnnl::matmul(pd), a_md, b_md, c_md, bias_md}).first->second;
}

void execute(const Shape& s, const void* a, const void* b, void* c, const float* bias) {
  ZERONE_ASSERT(s.batch0 > 0 && s.batch1 > 0 && s.m > 0 && s.n > 0 && s.k > 0, "matmul dims ", s.m, "x", s.n, "x", s.k);
  Entry& e = lookup(s);
  Context& ctx = context();
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(e.a_md, ctx.engine, const_cast<void*>(a))},
                                       {DNNL_ARG_WEIGHTS, memory(e.b_md, ctx.engine, const_cast<void*>(b))},
                                       {DNNL_ARG_DST, memory(e.c_md, ctx.engine, c)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(e.bias_md, ctx.engine, const_cast<float*>(bias)));
  e.primitive.execute(ctx.stream, args);
  ctx.stream.wait();
}

// Note [oneDNN 2.6 AMX column tails]: on CPUs with AMX, oneDNN 2.6.3's bf16 matmul returns wrong
// values (errors of the order of the results) for some shapes whose output column count n is not
// a multiple of 16 when it runs on more than one thread — e.g. m = 16, k = 32, n = 49..63 with a
// transposed B. GPT-2's padded shapes never hit it; LLaMA's unpadded vocabulary and small test
// shapes do. Such GEMMs run in f32 on the bf16 operands widened exactly: the same products, f32
// accumulation as oneDNN's bf16 path, only slower (and only for these shapes, only on AMX).
// tests/kernels/backend_ops_test.cc (linear_bf16_columns_1_to_80) holds it to the reference.
//
// Note [bf16 GEMMs without AVX-512]: oneDNN 2.6 has bf16 matmul kernels only from AVX-512 on; on
// an AVX2 CPU (AMD Zen 2-3, Intel before Skylake-SP) it cannot create the primitive at all. There
// every bf16 GEMM takes the same f32 path: exact products, f32 accumulation, so the same
// arithmetic up to the order of the sums, which the bf16 tolerance covers.
bool g_forced_fallback = false;                   // force_amx_column_fallback_for_testing
size_t g_band_bytes = size_t{16} << 20;           // the bf16 output's f32 band in the fallback
// Whether oneDNN can make a bf16 matmul on this CPU (asked once, with a 16 x 16 x 16 product).
bool onednn_has_bf16_matmul() {
  try {
    const memory::desc md({16, 16}, memory::data_type::bf16, memory::format_tag::ab);
    const memory::desc out({16, 16}, memory::data_type::f32, memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, out), context().engine);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}
bool bf16_needs_f32_fallback(DType dtype, int64_t n) {
  if (dtype != DType::bf16) return false;
  static const bool amx = dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx;
  static const bool no_bf16_kernels = !onednn_has_bf16_matmul();
  return no_bf16_kernels || (amx && n % 16 != 0) || g_forced_fallback;
}

// The elements a strided operand view spans (from its first element to its last, inclusive).
int64_t span_elements(int64_t batch0, int64_t batch1, int64_t rows, int64_t cols, const Strides4& s) {
  return (batch0 - 1) * s.batch0 + (batch1 - 1) * s.batch1 + (rows - 1) * s.row + (cols - 1) * s.col + 1;
}

// Widens `elements` bf16 values into a per-thread f32 buffer that grows to the largest request.
const float* widen_bf16(const void* src, int64_t elements, int slot) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& buf = buffers[slot];
  if (buf.size() < static_cast<size_t>(elements)) buf.resize(elements);
  convert_to_f32(src, DType::bf16, buf.data(), static_cast<size_t>(elements));
  return buf.data();
}

void execute_checked(const Shape& s, const void* a, const void* b, void* c, const float* bias) {
  if (!bf16_needs_f32_fallback(s.dtype, s.n)) return execute(s, a, b, c, bias);
  Shape f32 = s;
  f32.dtype = DType::f32;
  f32.c_dtype = DType::f32;
  const float* wide_a = widen_bf16(a, span_elements(s.batch0, s.batch1, s.m, s.k, s.a), 0);
  const float* wide_b = widen_bf16(b, span_elements(s.batch0, s.batch1, s.k, s.n, s.b), 1);
  if (s.c_dtype == DType::f32) return execute(f32, wide_a, wide_b, c, bias);
  // A bf16 C (plain 2-D, no accumulation): the f32 result, then rounded as oneDNN would store it,
  // in bands of rows so that the f32 buffer stays at most 16 MiB (the output may be an (N, Vp)
  // logits matrix, which bf16 storage exists to keep out of memory).
  ZERONE_ASSERT(s.batch0 == 1 && s.batch1 == 1 && !s.accumulate && s.c.row == s.n && s.c.col == 1,
                "a bf16 matmul output is a plain matrix");
  const int64_t band_rows = std::max<int64_t>(1, static_cast<int64_t>(g_band_bytes / (sizeof(float) * s.n)));
  thread_local std::vector<float> wide_c;
  wide_c.resize(static_cast<size_t>(std::min(band_rows, s.m) * s.n));
  for (int64_t r0 = 0; r0 < s.m; r0 += band_rows) {
    Shape band = f32;
    band.m = std::min(band_rows, s.m - r0);
    band.a.batch0 = band.a.batch1 = band.m * s.k;  // one matrix: the batch strides are unused
    band.c.batch0 = band.c.batch1 = band.m * s.n;
    execute(band, wide_a + r0 * s.a.row, wide_b, wide_c.data(), bias);
    convert_from_f32(wide_c.data(), static_cast<uint16_t*>(c) + r0 * s.n, DType::bf16, static_cast<size_t>(band.m) * s.n);
  }
}

}  // namespace

namespace {
// The shape of a plain 2-D product: strides express the transposes (A^T stored (K, M) is the
// (M, K) matrix with strides {1, M}).
Shape plain_shape(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType dtype, bool accumulate,
                  bool has_bias, DType c_dtype) {
  const Strides4 as = trans_a ? Strides4{m * k, m * k, 1, m} : Strides4{m * k, m * k, k, 1};
  const Strides4 bs = trans_b ? Strides4{k * n, k * n, 1, k} : Strides4{k * n, k * n, n, 1};
  const Strides4 cs{m * n, m * n, n, 1};
  return Shape{1, 1, m, n, k, as, bs, cs, dtype, 1.0f, accumulate, has_bias, c_dtype};
}
}  // namespace

void matmul(const void* a, bool trans_a, const void* b, bool trans_b, float* c, int64_t m, int64_t n,
            int64_t k, DType dtype, bool accumulate, const float* bias) {
  ProfileScope profile(ProfileCategory::gemm);
  execute_checked(plain_shape(trans_a, trans_b, m, n, k, dtype, accumulate, bias != nullptr, DType::f32), a, b, c,
                  bias);
}

void matmul_bf16_out(const void* a, bool trans_a, const void* b, bool trans_b, void* c, int64_t m, int64_t n,
                     int64_t k, const float* bias) {
  ProfileScope profile(ProfileCategory::gemm);
  execute_checked(plain_shape(trans_a, trans_b, m, n, k, DType::bf16, false, bias != nullptr, DType::bf16), a, b, c,
                  bias);
}

void batched_matmul(int64_t batch0, int64_t batch1, int64_t m, int64_t n, int64_t k, const void* a, Strides4 as,
                    const void* b, Strides4 bs, float* c, Strides4 cs, DType dtype, float alpha, bool accumulate) {
  // No profile scope of its own: the time counts to the caller's (attention).
  execute_checked(Shape{batch0, batch1, m, n, k, as, bs, cs, dtype, alpha, accumulate, false}, a, b, c, nullptr);
}

void force_amx_column_fallback_for_testing(bool on, size_t band_bytes) {
  g_forced_fallback = on;
  g_band_bytes = band_bytes > 0 ? band_bytes : size_t{16} << 20;
}

OneDnn& onednn() {
  static OneDnn ctx;
  return ctx;
}

dnnl::memory::data_type to_dnnl(DType dtype) {
  switch (dtype) {
    case DType::f32: return dnnl::memory::data_type::f32;
    case DType::bf16: return dnnl::memory::data_type::bf16;
    case DType::f16: return dnnl::memory::data_type::f16;
  }
  ZERONE_ASSERT(false);
}

const char* onednn_version_string() {
  static std::string text = [] {
    const dnnl_version_t* v = dnnl_version();
    return str_cat(v->major, ".", v->minor, ".", v->patch, " (cpu runtime: ",
                   v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other", ", max isa: ",
                   [] {
                     switch (dnnl::get_effective_cpu_isa()) {
                       case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
                       case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
                       case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
                       case dnnl::cpu_isa::avx512_core: return "avx512_core";
                       case dnnl::cpu_isa::avx2: return "avx2";
                       default: return "other";
                     }
                   }(),
                   ")");
  }();
  return text.c_str();
}

}  // namespace zerone::kernels::cpu
