#include "zerone/kernels/cpu/conv.h"

#include <omp.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "zerone/core/error.h"
#include "zerone/core/memory.h"
#include "zerone/core/profiler.h"
#include "zerone/kernels/cpu/onednn.h"

namespace zerone::kernels::cpu {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
constexpr memory::data_type f32 = memory::data_type::f32;

// Note [Primitive cache]: creating a oneDNN primitive costs milliseconds, running one on these
// small images tens of microseconds to milliseconds, so each shape's primitives are created at
// first use and kept for the process (a training run uses a handful of shapes: one per layer,
// times the train and the last, smaller validation batch).
//
// Note [Conv layouts]: the tensors zerone hands in are plain (NCHW / OIHW), but oneDNN's fast
// direct convolutions want blocked layouts (nChw16c, OIhw16i16o, ...); on plain ones it falls
// back to im2col + GEMM, several times slower. So the primitives are created with layouts left
// to oneDNN ("any"), and each operand whose chosen layout is not the plain one passes through a
// reorder into (or out of) a per-shape staging buffer (ledger category `scratch`). The reorders
// copy data only; the arithmetic is the blocked kernel's.

memory mem(const memory::desc& md, const void* p);

// One operand of one primitive: its plain layout, the layout the primitive chose, and when they
// differ a staging buffer with the reorders between them.
struct Operand {
  memory::desc plain, inner;
  bool staged = false;
  Buffer buffer;
  dnnl::reorder to_inner, to_plain;

  void init(const memory::desc& plain_md, const memory::desc& inner_md) {
    plain = plain_md;
    inner = inner_md;
    staged = plain != inner;
    if (!staged) return;
    dnnl::engine& eng = onednn().engine;
    buffer = Buffer(inner.get_size(), MemCategory::scratch);
    to_inner = dnnl::reorder(dnnl::reorder::primitive_desc(eng, plain, eng, inner));
    to_plain = dnnl::reorder(dnnl::reorder::primitive_desc(eng, inner, eng, plain));
  }
  // An input: `data` (plain) as the primitive wants it.
  memory input(const void* data) {
    if (!staged) return mem(plain, data);
    memory src = mem(plain, data), dst = mem(inner, buffer.data());
    to_inner.execute(onednn().stream, src, dst);
    return dst;
  }
  // An output: where the primitive writes; finish() moves it to `data` (plain).
  memory output(void* data) { return staged ? mem(inner, buffer.data()) : mem(plain, data); }
  void finish(void* data) {
    if (!staged) return;
    memory src = mem(inner, buffer.data()), dst = mem(plain, data);
    to_plain.execute(onednn().stream, src, dst);
  }
};

struct ConvEntry {
  memory::desc bias;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights bwd_weights;
  Operand fwd_src, fwd_weights, fwd_dst;               // forward
  Operand data_diff_dst, data_weights, data_diff_src;  // backward data
  Operand w_src, w_diff_dst, w_diff_weights;           // backward weights
  Buffer zero_bias, spare_diff_bias;                   // for calls without a bias
};

ConvEntry& conv_entry(const Conv2dShape& s) {
  static std::mutex mutex;
  static std::map<Conv2dShape, std::unique_ptr<ConvEntry>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(s); it != cache.end()) return *it->second;
  dnnl::engine& eng = onednn().engine;
  const memory::dims src_dims{s.N, s.C, s.H, s.W}, w_dims{s.OC, s.C, s.KH, s.KW}, dst_dims{s.N, s.OC, s.OH(), s.OW()};
  memory::desc src(src_dims, f32, tag::nchw), weights(w_dims, f32, tag::oihw), dst(dst_dims, f32, tag::nchw);
  memory::desc src_any(src_dims, f32, tag::any), w_any(w_dims, f32, tag::any), dst_any(dst_dims, f32, tag::any);
  memory::desc bias({s.OC}, f32, tag::x);
  const memory::dims strides{s.stride_h, s.stride_w}, pad{s.pad_h, s.pad_w};
  const auto alg = dnnl::algorithm::convolution_direct;
  dnnl::convolution_forward::primitive_desc fwd_pd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src_any, w_any, bias, dst_any, strides,
                                      pad, pad),
      eng);
  dnnl::convolution_backward_data::primitive_desc data_pd(
      dnnl::convolution_backward_data::desc(alg, src_any, w_any, dst_any, strides, pad, pad), eng, fwd_pd);
  dnnl::convolution_backward_weights::primitive_desc weights_pd(
      dnnl::convolution_backward_weights::desc(alg, src_any, w_any, bias, dst_any, strides, pad, pad), eng, fwd_pd);
  auto e = std::make_unique<ConvEntry>();
  e->bias = bias;
  e->fwd = dnnl::convolution_forward(fwd_pd);
  e->bwd_data = dnnl::convolution_backward_data(data_pd);
  e->bwd_weights = dnnl::convolution_backward_weights(weights_pd);
  e->fwd_src.init(src, fwd_pd.src_desc());
  e->fwd_weights.init(weights, fwd_pd.weights_desc());
  e->fwd_dst.init(dst, fwd_pd.dst_desc());
  e->data_diff_dst.init(dst, data_pd.diff_dst_desc());
  e->data_weights.init(weights, data_pd.weights_desc());
  e->data_diff_src.init(src, data_pd.diff_src_desc());
  e->w_src.init(src, weights_pd.src_desc());
  e->w_diff_dst.init(dst, weights_pd.diff_dst_desc());
  e->w_diff_weights.init(weights, weights_pd.diff_weights_desc());
  e->zero_bias = Buffer(s.OC * sizeof(float), MemCategory::scratch);  // zeroed
  e->spare_diff_bias = Buffer(s.OC * sizeof(float), MemCategory::scratch);
  return *cache.emplace(s, std::move(e)).first->second;
}

memory mem(const memory::desc& md, const void* p) { return memory(md, onednn().engine, const_cast<void*>(p)); }

void run(dnnl::primitive& p, const std::unordered_map<int, memory>& args) {
  p.execute(onednn().stream, args);
  onednn().stream.wait();
}

// Scratch for parameter gradients that must be added rather than written (one per process,
// grows to the largest request; ledger category `scratch`).
float* grad_scratch(size_t numel) {
  static Buffer buffer;
  if (buffer.bytes() < numel * sizeof(float)) buffer = Buffer(numel * sizeof(float), MemCategory::scratch);
  return buffer.as<float>();
}

void add_into(float* dst, const float* src, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

// Max pooling runs in the channel-blocked layout (nChw16c) too, where oneDNN's kernel handles 16
// channels per vector; on plain NCHW it was slower than the reorders in and out (Note [Conv
// layouts]). The workspace (argmax) stays in the blocked layout between forward and backward.
struct PoolEntry {
  memory::desc workspace;
  dnnl::pooling_forward fwd;
  dnnl::pooling_backward bwd;
  Operand fwd_src, fwd_dst, bwd_diff_dst, bwd_diff_src;
};

PoolEntry& pool_entry(const Pool2dShape& s) {
  static std::mutex mutex;
  static std::map<Pool2dShape, std::unique_ptr<PoolEntry>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(s); it != cache.end()) return *it->second;
  dnnl::engine& eng = onednn().engine;
  const memory::dims src_dims{s.N, s.C, s.H, s.W}, dst_dims{s.N, s.C, s.OH(), s.OW()};
  memory::desc src(src_dims, f32, tag::nchw), dst(dst_dims, f32, tag::nchw);
  memory::desc src_blocked(src_dims, f32, tag::nChw16c), dst_blocked(dst_dims, f32, tag::nChw16c);
  const memory::dims strides{s.stride_h, s.stride_w}, kernel{s.KH, s.KW}, pad{s.pad_h, s.pad_w};
  const auto alg = dnnl::algorithm::pooling_max;
  dnnl::pooling_forward::primitive_desc fwd_pd(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, src_blocked, dst_blocked, strides, kernel, pad,
                                  pad),
      eng);
  dnnl::pooling_backward::primitive_desc bwd_pd(
      dnnl::pooling_backward::desc(alg, src_blocked, dst_blocked, strides, kernel, pad, pad), eng, fwd_pd);
  auto e = std::make_unique<PoolEntry>();
  e->workspace = fwd_pd.workspace_desc();
  e->fwd = dnnl::pooling_forward(fwd_pd);
  e->bwd = dnnl::pooling_backward(bwd_pd);
  e->fwd_src.init(src, fwd_pd.src_desc());
  e->fwd_dst.init(dst, fwd_pd.dst_desc());
  e->bwd_diff_dst.init(dst, bwd_pd.diff_dst_desc());
  e->bwd_diff_src.init(src, bwd_pd.diff_src_desc());
  return *cache.emplace(s, std::move(e)).first->second;
}

}  // namespace

void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias, const Conv2dShape& s) {
  ZERONE_ASSERT(s.OH() > 0 && s.OW() > 0, "conv2d: empty output for input ", s.H, "x", s.W, " kernel ", s.KH, "x", s.KW);
  ProfileScope profile(ProfileCategory::gemm);
  ConvEntry& e = conv_entry(s);
  run(e.fwd, {{DNNL_ARG_SRC, e.fwd_src.input(inp)},
              {DNNL_ARG_WEIGHTS, e.fwd_weights.input(weight)},
              {DNNL_ARG_BIAS, mem(e.bias, bias ? bias : e.zero_bias.as<float>())},
              {DNNL_ARG_DST, e.fwd_dst.output(out)}});
  e.fwd_dst.finish(out);
  onednn().stream.wait();
}

void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, const Conv2dShape& s, bool accumulate_param_grads) {
  ProfileScope profile(ProfileCategory::gemm);
  ConvEntry& e = conv_entry(s);
  if (dinp) {
    run(e.bwd_data, {{DNNL_ARG_DIFF_DST, e.data_diff_dst.input(dout)},
                     {DNNL_ARG_WEIGHTS, e.data_weights.input(weight)},
                     {DNNL_ARG_DIFF_SRC, e.data_diff_src.output(dinp)}});
    e.data_diff_src.finish(dinp);
  }
  // oneDNN writes the parameter gradients; accumulating goes through scratch.
  const size_t wn = static_cast<size_t>(s.OC) * s.C * s.KH * s.KW;
  float* dw = accumulate_param_grads ? grad_scratch(wn + s.OC) : dweight;
  float* db = !dbias ? e.spare_diff_bias.as<float>() : accumulate_param_grads ? dw + wn : dbias;
  run(e.bwd_weights, {{DNNL_ARG_SRC, e.w_src.input(inp)},
                      {DNNL_ARG_DIFF_DST, e.w_diff_dst.input(dout)},
                      {DNNL_ARG_DIFF_WEIGHTS, e.w_diff_weights.output(dw)},
                      {DNNL_ARG_DIFF_BIAS, mem(e.bias, db)}});
  e.w_diff_weights.finish(dw);
  onednn().stream.wait();
  if (accumulate_param_grads) {
    add_into(dweight, dw, wn);
    if (dbias) add_into(dbias, db, s.OC);
  }
}

size_t maxpool2d_workspace_bytes(const Pool2dShape& s) { return pool_entry(s).workspace.get_size(); }

void maxpool2d_forward(float* out, void* workspace, const float* inp, const Pool2dShape& s) {
  ZERONE_ASSERT(s.OH() > 0 && s.OW() > 0, "maxpool2d: empty output for input ", s.H, "x", s.W);
  ProfileScope profile(ProfileCategory::elementwise);
  PoolEntry& e = pool_entry(s);
  run(e.fwd, {{DNNL_ARG_SRC, e.fwd_src.input(inp)}, {DNNL_ARG_DST, e.fwd_dst.output(out)},
              {DNNL_ARG_WORKSPACE, mem(e.workspace, workspace)}});
  e.fwd_dst.finish(out);
  onednn().stream.wait();
}

void maxpool2d_backward(float* dinp, const float* dout, const void* workspace, const Pool2dShape& s) {
  ProfileScope profile(ProfileCategory::elementwise);
  PoolEntry& e = pool_entry(s);
  run(e.bwd, {{DNNL_ARG_DIFF_DST, e.bwd_diff_dst.input(dout)}, {DNNL_ARG_DIFF_SRC, e.bwd_diff_src.output(dinp)},
              {DNNL_ARG_WORKSPACE, mem(e.workspace, workspace)}});
  e.bwd_diff_src.finish(dinp);
  onednn().stream.wait();
}

}  // namespace zerone::kernels::cpu
