#include "zerone/kernels/cpu/conv.h"

#include <omp.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
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
// Note [Conv layouts]: oneDNN's fast direct convolutions want channel-blocked activations
// (nChw16c with AVX-512: 16 channels of one pixel side by side, channels padded to 16 with zeros)
// and blocked weights (OIhw16i16o, ...); on plain NCHW it falls back to im2col + GEMM, several
// times slower. Max pooling too is faster blocked (16 channels per vector). So the primitives are
// created with layouts left to oneDNN ("any"; pooling: the blocked layout), and each operand whose
// chosen layout differs from the one the caller holds passes through a reorder into (or out of) a
// per-shape staging buffer (ledger category `scratch`). Callers that hold plain tensors pay ~2
// reorders per operand per step; the sequential model (nn/sequential.cc) instead holds the
// activations of a conv -> pool -> relu -> conv chain blocked (ActLayout::blocked, the layout the
// convolutions choose, so no reorder is needed), converting once where the chain meets a layer
// that needs plain data (flatten, dropout) and once back in the backward. Only the small weight
// tensors are still reordered per call. Reorders copy data only: the arithmetic is the blocked
// kernel's either way, so the layout held changes no result.

memory mem(const memory::desc& md, const void* p);

tag blocked_tag() {
  const int block = activation_channel_block();
  return block == 16 ? tag::nChw16c : block == 8 ? tag::nChw8c : tag::nchw;
}

// The layout a caller's activation (N, C, H, W) has.
memory::desc held(const memory::dims& dims, ActLayout layout) {
  return memory::desc(dims, f32, layout == ActLayout::blocked ? blocked_tag() : tag::nchw);
}

// One operand of one primitive: the layout the caller holds (`outer`: plain, or blocked),
// the layout the primitive chose (`inner`), and when they differ a staging buffer with the
// reorders between them.
struct Operand {
  memory::desc outer, inner;
  bool staged = false;
  Buffer buffer;
  dnnl::reorder to_inner, to_outer;

  void init(const memory::desc& outer_md, const memory::desc& inner_md) {
    outer = outer_md;
    inner = inner_md;
    staged = outer != inner;
    if (!staged) return;
    dnnl::engine& eng = onednn().engine;
    buffer = Buffer(inner.get_size(), MemCategory::scratch, MemPlace::device, 64, default_arena());
    to_inner = dnnl::reorder(dnnl::reorder::primitive_desc(eng, outer, eng, inner));
    to_outer = dnnl::reorder(dnnl::reorder::primitive_desc(eng, inner, eng, outer));
  }
  // An input: `data` (in the outer layout) as the primitive wants it.
  memory input(const void* data) {
    if (!staged) return mem(outer, data);
    memory src = mem(outer, data), dst = mem(inner, buffer.data());
    to_inner.execute(onednn().stream, src, dst);
    return dst;
  }
  // An output: where the primitive writes; finish() moves it to `data` (outer layout).
  memory output(void* data) { return staged ? mem(inner, buffer.data()) : mem(outer, data); }
  void finish(void* data) {
    if (!staged) return;
    memory src = mem(inner, buffer.data()), dst = mem(outer, data);
    to_outer.execute(onednn().stream, src, dst);
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
  memory::desc src = held(src_dims, s.src_layout), weights(w_dims, f32, tag::oihw), dst = held(dst_dims, s.dst_layout);
  memory::desc src_any(src_dims, f32, tag::any), w_any(w_dims, f32, tag::any), dst_any(dst_dims, f32, tag::any);
  memory::desc bias({s.OC}, f32, tag::x);
  const memory::dims strides{s.stride_h, s.stride_w}, pad{s.pad_h, s.pad_w};
  const auto alg = dnnl::algorithm::convolution_direct;
  dnnl::convolution_forward::primitive_desc fwd_pd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src_any, w_any, bias, dst_any, strides,
                                      pad, pad),
      eng);
  // Note [Backward layouts]: left to choose ("any"), oneDNN 2.6 runs the backward of a layer
  // whose input channels are not a multiple of the channel block (10 in mnist-cnn's second conv)
  // on blocked layouts that pad them (10 -> 16), and for the weight gradient even falls to its
  // AVX2 kernel in 8-channel blocks. Its AVX-512 kernels on NHWC tensors, which need no padding,
  // take 0.30 instead of 0.45 ms (data) and 0.43 instead of 0.79 ms (weights) per call there (B 64,
  // one core of an AVX-512 AMD EPYC), against about 0.02 ms per reorder to and from NHWC. So NHWC
  // is tried first for such layers (with more than 4 input channels: below that oneDNN's
  // plain-input "first convolution" kernels are its fast path), then "any", then (weights) NHWC;
  // the first that runs an AVX-512 (or AMX) kernel wins, else "any"'s choice. The rule reads only what oneDNN offers,
  // never timings, so every rank and run picks the same kernels (and gets the same bits).
  const memory::desc src_nhwc(src_dims, f32, tag::nhwc), dst_nhwc(dst_dims, f32, tag::nhwc);
  const int block = activation_channel_block();
  const bool nhwc_first = block > 0 && s.C % block != 0 && s.C > 4;
  auto wide_isa = [](const dnnl::primitive_desc_base& pd) {
    const std::string impl = pd.impl_info_str();
    return impl.find("avx512") != std::string::npos || impl.find("amx") != std::string::npos;
  };
  // The first candidate layout (nhwc: true) that gives a wide-ISA kernel, else `any`'s.
  auto choose = [&](auto make, std::initializer_list<bool> candidates) {
    auto fallback = make(false);
    for (bool nhwc : candidates) {
      try {
        auto pd = nhwc ? make(true) : fallback;
        if (wide_isa(pd)) return pd;
      } catch (const dnnl::error&) {  // no implementation for that layout
      }
    }
    return fallback;
  };
  auto data_pd = choose(
      [&](bool nhwc) {
        return dnnl::convolution_backward_data::primitive_desc(
            dnnl::convolution_backward_data::desc(alg, nhwc ? src_nhwc : src_any, w_any, nhwc ? dst_nhwc : dst_any,
                                                  strides, pad, pad),
            eng, fwd_pd);
      },
      nhwc_first ? std::initializer_list<bool>{true, false} : std::initializer_list<bool>{false});
  auto weights_pd = choose(
      [&](bool nhwc) {
        return dnnl::convolution_backward_weights::primitive_desc(
            dnnl::convolution_backward_weights::desc(alg, nhwc ? src_nhwc : src_any, w_any, bias,
                                                     nhwc ? dst_nhwc : dst_any, strides, pad, pad),
            eng, fwd_pd);
      },
      nhwc_first ? std::initializer_list<bool>{true, false} : std::initializer_list<bool>{false, true});
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
  e->zero_bias = Buffer(s.OC * sizeof(float), MemCategory::scratch, MemPlace::device, 64, default_arena());  // zeroed
  e->spare_diff_bias = Buffer(s.OC * sizeof(float), MemCategory::scratch, MemPlace::device, 64, default_arena());
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
  if (buffer.bytes() < numel * sizeof(float)) buffer = Buffer(numel * sizeof(float), MemCategory::scratch, MemPlace::device, 64, default_arena());
  return buffer.as<float>();
}

void add_into(float* dst, const float* src, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

// Max pooling runs in the channel-blocked layout too, where oneDNN's kernel handles 16 channels
// per vector; on plain NCHW it was slower than the reorders in and out (Note [Conv layouts]). The
// workspace (argmax) stays in the blocked layout between forward and backward.
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
  memory::desc src = held(src_dims, s.layout), dst = held(dst_dims, s.layout);
  memory::desc src_blocked(src_dims, f32, blocked_tag()), dst_blocked(dst_dims, f32, blocked_tag());
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

// Reorders between plain and blocked activations, per (N, C, H, W) and direction.
struct ActReorder {
  memory::desc plain, blocked;
  dnnl::reorder to_plain, to_blocked;
};

ActReorder& act_reorder(int N, int C, int H, int W) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int>, std::unique_ptr<ActReorder>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(N, C, H, W);
  if (auto it = cache.find(key); it != cache.end()) return *it->second;
  dnnl::engine& eng = onednn().engine;
  auto e = std::make_unique<ActReorder>();
  e->plain = held({N, C, H, W}, ActLayout::plain);
  e->blocked = held({N, C, H, W}, ActLayout::blocked);
  e->to_plain = dnnl::reorder(dnnl::reorder::primitive_desc(eng, e->blocked, eng, e->plain));
  e->to_blocked = dnnl::reorder(dnnl::reorder::primitive_desc(eng, e->plain, eng, e->blocked));
  return *cache.emplace(key, std::move(e)).first->second;
}

}  // namespace

int activation_channel_block() {
  // The layout oneDNN's convolution chooses for a typical mid-network layer's output.
  static const int block = [] {
    const memory::dims src_dims{8, 16, 14, 14}, w_dims{32, 16, 3, 3}, dst_dims{8, 32, 12, 12};
    dnnl::convolution_forward::primitive_desc pd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                        memory::desc(src_dims, f32, tag::any), memory::desc(w_dims, f32, tag::any),
                                        memory::desc({32}, f32, tag::x), memory::desc(dst_dims, f32, tag::any),
                                        {1, 1}, {0, 0}, {0, 0}),
        onednn().engine);
    if (pd.dst_desc() == memory::desc(dst_dims, f32, tag::nChw16c)) return 16;
    if (pd.dst_desc() == memory::desc(dst_dims, f32, tag::nChw8c)) return 8;
    return 0;
  }();
  return block;
}

size_t activation_numel(int C, int H, int W, ActLayout layout) {
  const int block = activation_channel_block();
  const size_t c = layout == ActLayout::blocked && block > 0 ? (static_cast<size_t>(C) + block - 1) / block * block : C;
  return c * static_cast<size_t>(H) * W;
}

void activation_to_plain(float* out, const float* blocked, int N, int C, int H, int W) {
  ProfileScope profile(ProfileCategory::elementwise);
  ActReorder& r = act_reorder(N, C, H, W);
  memory src = mem(r.blocked, blocked), dst = mem(r.plain, out);
  r.to_plain.execute(onednn().stream, src, dst);
  onednn().stream.wait();
}

void activation_to_blocked(float* out, const float* plain, int N, int C, int H, int W) {
  ProfileScope profile(ProfileCategory::elementwise);
  ActReorder& r = act_reorder(N, C, H, W);
  memory src = mem(r.plain, plain), dst = mem(r.blocked, out);
  r.to_blocked.execute(onednn().stream, src, dst);
  onednn().stream.wait();
}

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
  std::optional<memory> diff_dst;  // staged for the data gradient, when the weights' wants the same layout
  if (dinp) {
    memory dd = e.data_diff_dst.input(dout);
    if (e.data_diff_dst.staged && e.data_diff_dst.inner == e.w_diff_dst.inner) diff_dst = dd;
    run(e.bwd_data, {{DNNL_ARG_DIFF_DST, dd},
                     {DNNL_ARG_WEIGHTS, e.data_weights.input(weight)},
                     {DNNL_ARG_DIFF_SRC, e.data_diff_src.output(dinp)}});
    e.data_diff_src.finish(dinp);
  }
  // oneDNN writes the parameter gradients; accumulating goes through scratch.
  const size_t wn = static_cast<size_t>(s.OC) * s.C * s.KH * s.KW;
  float* dw = accumulate_param_grads ? grad_scratch(wn + s.OC) : dweight;
  float* db = !dbias ? e.spare_diff_bias.as<float>() : accumulate_param_grads ? dw + wn : dbias;
  run(e.bwd_weights, {{DNNL_ARG_SRC, e.w_src.input(inp)},
                      {DNNL_ARG_DIFF_DST, diff_dst ? *diff_dst : e.w_diff_dst.input(dout)},
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
