#include "zerone/kernels/cpu/matmul.h"

#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "zerone/core/error.h"
#include "zerone/core/profiler.h"

namespace zerone::kernels::cpu {
namespace {

using dnnl::memory;

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

Context& context() {
  static Context ctx;
  return ctx;
}

using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, DType, bool, bool>;

memory::data_type to_dnnl(DType dtype) {
  switch (dtype) {
    case DType::f32: return memory::data_type::f32;
    case DType::bf16: return memory::data_type::bf16;
    case DType::f16: return memory::data_type::f16;
  }
  ZERONE_ASSERT(false);
}

struct Entry {
  dnnl::matmul primitive;
  memory::desc a_md, b_md, c_md, bias_md;
};

Entry& lookup(const Key& key) {
  static std::mutex mutex;
  static std::map<Key, Entry> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto [m, n, k, trans_a, trans_b, dtype, accumulate, has_bias] = key;
  memory::data_type dt = to_dnnl(dtype);
  // Strides express the transposes: A^T stored (K, M) is the (M, K) matrix with strides {1, M}.
  memory::desc a_md({m, k}, dt, trans_a ? memory::dims{1, m} : memory::dims{k, 1});
  memory::desc b_md({k, n}, dt, trans_b ? memory::dims{1, k} : memory::dims{n, 1});
  memory::desc c_md({m, n}, memory::data_type::f32, memory::dims{n, 1});
  memory::desc bias_md;
  if (has_bias) bias_md = memory::desc({1, n}, memory::data_type::f32, memory::dims{n, 1});
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  auto desc = has_bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md) : dnnl::matmul::desc(a_md, b_md, c_md);
  dnnl::matmul::primitive_desc pd(desc, attr, context().engine);
  auto [pos, inserted] = cache.emplace(key, Entry{dnnl::matmul(pd), a_md, b_md, c_md, bias_md});
  return pos->second;
}

}  // namespace

void matmul(const void* a, bool trans_a, const void* b, bool trans_b, float* c, int64_t m, int64_t n,
            int64_t k, DType dtype, bool accumulate, const float* bias) {
  ProfileScope profile(ProfileCategory::gemm);
  ZERONE_ASSERT(m > 0 && n > 0 && k > 0, "matmul dims ", m, "x", n, "x", k);
  Entry& e = lookup(Key{m, n, k, trans_a, trans_b, dtype, accumulate, bias != nullptr});
  Context& ctx = context();
  memory a_mem(e.a_md, ctx.engine, const_cast<void*>(a));
  memory b_mem(e.b_md, ctx.engine, const_cast<void*>(b));
  memory c_mem(e.c_md, ctx.engine, c);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(e.bias_md, ctx.engine, const_cast<float*>(bias)));
  e.primitive.execute(ctx.stream, args);
  ctx.stream.wait();
}

void batched_matmul(int64_t batch0, int64_t batch1, int64_t m, int64_t n, int64_t k, const void* a, Strides4 as,
                    const void* b, Strides4 bs, float* c, Strides4 cs, DType dtype, float alpha, bool accumulate) {
  // No profile scope of its own: the time counts to the caller's (attention).
  ZERONE_ASSERT(batch0 > 0 && batch1 > 0 && m > 0 && n > 0 && k > 0);
  using BKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, Strides4, Strides4, Strides4, DType, float, bool>;
  struct BEntry {
    dnnl::matmul primitive;
    memory::desc a_md, b_md, c_md;
  };
  static std::mutex mutex;
  static std::map<BKey, BEntry> cache;
  BKey key{batch0, batch1, m, n, k, as, bs, cs, dtype, alpha, accumulate};
  BEntry* e;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it == cache.end()) {
      memory::data_type dt = to_dnnl(dtype);
      memory::desc a_md({batch0, batch1, m, k}, dt, {as.batch0, as.batch1, as.row, as.col});
      memory::desc b_md({batch0, batch1, k, n}, dt, {bs.batch0, bs.batch1, bs.row, bs.col});
      memory::desc c_md({batch0, batch1, m, n}, memory::data_type::f32, {cs.batch0, cs.batch1, cs.row, cs.col});
      dnnl::primitive_attr attr;
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (accumulate) {
        dnnl::post_ops ops;
        ops.append_sum(1.0f);
        attr.set_post_ops(ops);
      }
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, context().engine);
      it = cache.emplace(key, BEntry{dnnl::matmul(pd), a_md, b_md, c_md}).first;
    }
    e = &it->second;
  }
  Context& ctx = context();
  memory a_mem(e->a_md, ctx.engine, const_cast<void*>(a));
  memory b_mem(e->b_md, ctx.engine, const_cast<void*>(b));
  memory c_mem(e->c_md, ctx.engine, c);
  e->primitive.execute(ctx.stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
  ctx.stream.wait();
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
