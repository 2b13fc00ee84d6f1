#include "zerone/kernels/cpu/conv.h"

#include <omp.h>

#include <cstring>
#include <map>
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
// small images tens of microseconds, so each shape's primitives are created at first use and kept
// for the process (a training run uses a handful of shapes: one per layer, times the train and
// the last, smaller validation batch). The tensors are in plain layouts (NCHW / OIHW): oneDNN picks
// its best implementation for them, and nothing needs a reorder.
struct ConvEntry {
  memory::desc src, weights, bias, dst;
  dnnl::convolution_forward fwd;
  dnnl::convolution_forward fwd_no_bias;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights bwd_weights;
  dnnl::convolution_backward_weights bwd_weights_no_bias;
};

ConvEntry& conv_entry(const Conv2dShape& s) {
  static std::mutex mutex;
  static std::map<Conv2dShape, ConvEntry> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(s); it != cache.end()) return it->second;
  dnnl::engine& eng = onednn().engine;
  memory::desc src({s.N, s.C, s.H, s.W}, f32, tag::nchw);
  memory::desc weights({s.OC, s.C, s.KH, s.KW}, f32, tag::oihw);
  memory::desc bias({s.OC}, f32, tag::x);
  memory::desc dst({s.N, s.OC, s.OH(), s.OW()}, f32, tag::nchw);
  const memory::dims strides{s.stride_h, s.stride_w}, pad{s.pad_h, s.pad_w};
  const auto alg = dnnl::algorithm::convolution_direct;
  const auto prop = dnnl::prop_kind::forward_training;
  dnnl::convolution_forward::primitive_desc fwd_pd(
      dnnl::convolution_forward::desc(prop, alg, src, weights, bias, dst, strides, pad, pad), eng);
  dnnl::convolution_forward::primitive_desc fwd_nb_pd(
      dnnl::convolution_forward::desc(prop, alg, src, weights, dst, strides, pad, pad), eng);
  dnnl::convolution_backward_data::primitive_desc data_pd(
      dnnl::convolution_backward_data::desc(alg, src, weights, dst, strides, pad, pad), eng, fwd_pd);
  dnnl::convolution_backward_weights::primitive_desc weights_pd(
      dnnl::convolution_backward_weights::desc(alg, src, weights, bias, dst, strides, pad, pad), eng, fwd_pd);
  dnnl::convolution_backward_weights::primitive_desc weights_nb_pd(
      dnnl::convolution_backward_weights::desc(alg, src, weights, dst, strides, pad, pad), eng, fwd_nb_pd);
  return cache
      .emplace(s, ConvEntry{src, weights, bias, dst, dnnl::convolution_forward(fwd_pd),
                            dnnl::convolution_forward(fwd_nb_pd), dnnl::convolution_backward_data(data_pd),
                            dnnl::convolution_backward_weights(weights_pd),
                            dnnl::convolution_backward_weights(weights_nb_pd)})
      .first->second;
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

struct PoolEntry {
  memory::desc src, dst, workspace;
  dnnl::pooling_forward fwd;
  dnnl::pooling_backward bwd;
};

PoolEntry& pool_entry(const Pool2dShape& s) {
  static std::mutex mutex;
  static std::map<Pool2dShape, PoolEntry> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(s); it != cache.end()) return it->second;
  dnnl::engine& eng = onednn().engine;
  memory::desc src({s.N, s.C, s.H, s.W}, f32, tag::nchw);
  memory::desc dst({s.N, s.C, s.OH(), s.OW()}, f32, tag::nchw);
  const memory::dims strides{s.stride_h, s.stride_w}, kernel{s.KH, s.KW}, pad{s.pad_h, s.pad_w};
  const auto alg = dnnl::algorithm::pooling_max;
  dnnl::pooling_forward::primitive_desc fwd_pd(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, src, dst, strides, kernel, pad, pad), eng);
  dnnl::pooling_backward::primitive_desc bwd_pd(dnnl::pooling_backward::desc(alg, src, dst, strides, kernel, pad, pad),
                                                eng, fwd_pd);
  return cache
      .emplace(s, PoolEntry{src, dst, fwd_pd.workspace_desc(), dnnl::pooling_forward(fwd_pd),
                            dnnl::pooling_backward(bwd_pd)})
      .first->second;
}

}  // namespace

void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias, const Conv2dShape& s) {
  ZERONE_ASSERT(s.OH() > 0 && s.OW() > 0, "conv2d: empty output for input ", s.H, "x", s.W, " kernel ", s.KH, "x", s.KW);
  ProfileScope profile(ProfileCategory::gemm);
  ConvEntry& e = conv_entry(s);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, mem(e.src, inp)}, {DNNL_ARG_WEIGHTS, mem(e.weights, weight)}, {DNNL_ARG_DST, mem(e.dst, out)}};
  if (bias) {
    args.emplace(DNNL_ARG_BIAS, mem(e.bias, bias));
    run(e.fwd, args);
  } else {
    run(e.fwd_no_bias, args);
  }
}

void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, const Conv2dShape& s, bool accumulate_param_grads) {
  ProfileScope profile(ProfileCategory::gemm);
  ConvEntry& e = conv_entry(s);
  if (dinp)
    run(e.bwd_data, {{DNNL_ARG_DIFF_DST, mem(e.dst, dout)},
                     {DNNL_ARG_WEIGHTS, mem(e.weights, weight)},
                     {DNNL_ARG_DIFF_SRC, mem(e.src, dinp)}});
  // oneDNN writes the weight gradients; accumulating goes through scratch.
  const size_t wn = static_cast<size_t>(s.OC) * s.C * s.KH * s.KW;
  float* dw = accumulate_param_grads ? grad_scratch(wn + s.OC) : dweight;
  float* db = dbias ? (accumulate_param_grads ? dw + wn : dbias) : nullptr;
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, mem(e.src, inp)},
                                       {DNNL_ARG_DIFF_DST, mem(e.dst, dout)},
                                       {DNNL_ARG_DIFF_WEIGHTS, mem(e.weights, dw)}};
  if (db) {
    args.emplace(DNNL_ARG_DIFF_BIAS, mem(e.bias, db));
    run(e.bwd_weights, args);
  } else {
    run(e.bwd_weights_no_bias, args);
  }
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
  run(e.fwd, {{DNNL_ARG_SRC, mem(e.src, inp)}, {DNNL_ARG_DST, mem(e.dst, out)},
              {DNNL_ARG_WORKSPACE, mem(e.workspace, workspace)}});
}

void maxpool2d_backward(float* dinp, const float* dout, const void* workspace, const Pool2dShape& s) {
  ProfileScope profile(ProfileCategory::elementwise);
  PoolEntry& e = pool_entry(s);
  run(e.bwd, {{DNNL_ARG_DIFF_DST, mem(e.dst, dout)}, {DNNL_ARG_DIFF_SRC, mem(e.src, dinp)},
              {DNNL_ARG_WORKSPACE, mem(e.workspace, workspace)}});
}

}  // namespace zerone::kernels::cpu
