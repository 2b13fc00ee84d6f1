// Backend: every operation the models, the optimizers and the ZeRO engine perform on device memory,
// bound to one device (DESIGN §1; after ggml's backend interface).
//
// A device is where compute reads and writes (MemPlace::device, core/memory.h). Host code never
// dereferences device memory: it hands device pointers to a backend, which runs the operation
// where the memory is. Three backends implement this interface:
//   cpu   today's kernels (kernels/cpu) on host memory; device memory is an accounted arena of host
//         memory, so every operation is a direct call. The executable spec of every other backend.
//   sim   a simulated device (kernels/sim): memory the host cannot touch (addresses the CPU faults
//         on), which only the backend translates before running the cpu kernels. It proves the seam:
//         any host access to device memory that bypasses the backend crashes at once.
//   cuda  an NVIDIA GPU (kernels/cuda), built when nvcc is found.
//
// Conventions of the operations (the cpu kernels' headers give each one's formula and shapes):
//  - Pointers are device memory unless a parameter says `host`. Shapes are written inline: B batch,
//    T time, C channels, NH heads, V vocabulary, Vp padded vocabulary, N = B*T rows.
//  - Activations and gradients are f32; parameters are read in their storage dtype.
//  - Parameter gradients accumulate (+=) unless told otherwise (Note [Fresh gradients] in
//    nn/flat_param.h); input gradients overwrite unless the kernel says it accumulates.
//  - Every device operand's extent follows from the shape arguments (the shapes written in the
//    kernels' headers); a backend may check each whole range (Note [Operand ranges],
//    kernels/cpu/cpu_backend.h): the simulated device aborts on a range that runs off its allocation.
//  - Operations returning a host value (a loss, a sum of squares) finish the work they depend on.
//
// Note [Streams and events]: work on a device is ordered by streams (compute, comm, and one copy
// stream per direction: host_to_device, device_to_host); an
// Event marks a point in one stream, another stream or the host can wait on it. The cpu and sim
// backends run every operation inline on the calling thread, in call order, so their events are
// complete when recorded. Reuse rule for pooled memory: a buffer goes back to a pool with the events
// of its last use on each stream that used it (record() after that use) and is handed out again,
// or freed, only after every one of them completed (BufferPool, core/memory.h; on the inline
// backends at once).
//
// Thread-safety: one thread drives a backend's operations (the training thread); the memory arena
// and the copy operations may also be used from the communication thread. Failures inside an
// operation are internal invariants (abort) except out-of-memory, which throws Error through Buffer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/core/event.h"
#include "zerone/core/memory.h"
#include "zerone/core/pending_sum.h"
#include "zerone/kernels/types.h"

namespace zerone {
class DeviceTimeline;  // core/profiler.h
}  // namespace zerone

namespace zerone::kernels {

enum class DeviceKind : uint8_t { cpu, sim, cuda };
const char* device_kind_name(DeviceKind kind);
// "cpu", "sim" or "cuda"; throws Error naming --device and the choices otherwise.
DeviceKind parse_device_kind(const std::string& name);
// The device a run names (`--device`): default_device() when `name` is empty (not given), else
// parse_device_kind(name).
DeviceKind device_or_default(const std::string& name);

enum class Stream : uint8_t { compute, comm, host_to_device, device_to_host };

// A point in a stream's work (Note [Streams and events]); the type lives in core so that pooled
// memory can keep its last uses (core/event.h). A default Event is complete.
using Event = zerone::Event;

// Bytes of n values in the packed form of Note [Blockwise quantization] (kernels/cpu/quantize.h).
size_t quantized_bytes(size_t n, int bits, size_t block);

// Note [Attention's saved state]: what attention_forward keeps in `att` for attention_backward is
// the backend's choice (Backend::attention_saved):
//   probabilities  the causal softmax (B, NH, T, T), zero above the diagonal (cpu, sim, and cuda's
//                  plain kernels);
//   logsumexp      each row's logsumexp of its scaled scores (B, NH, T), f32 (cuda's flash
//                  kernels, which recompute the probabilities tile by tile in backward).
// Callers size `att` with attention_saved_numel and hand it only to attention_backward.
enum class AttentionSaved : uint8_t { probabilities, logsumexp };
// Floats of `att` for one attention call of that shape.
size_t attention_saved_numel(AttentionSaved saved, int B, int NH, int T);

// How the CUDA backend runs attention (`--cuda-attention`): flash (the default; Note [Flash
// attention on CUDA cores], kernels/cuda/attention.cu) or plain (one thread per output element
// with the probabilities in memory; kept so that a GPU session can bisect a failure).
enum class CudaAttention : uint8_t { flash, plain };
const char* cuda_attention_name(CudaAttention kind);
// "flash" or "plain"; throws Error naming --cuda-attention and the choices otherwise.
CudaAttention parse_cuda_attention(const std::string& name);

// Note [Known GPU peaks]: MFU needs the device's peak. A GPU's cannot be measured in the step's
// time, but the vendor's dense 16-bit tensor figure is a fact of the product: the GPUs a GPU
// session or a user most likely has, matched by the name the driver reports (cudaDeviceProp::name:
// "NVIDIA H100 80GB HBM3" is the SXM part, "NVIDIA H100 PCIe", "NVIDIA H100 NVL"; "NVIDIA H200",
// "NVIDIA H200 NVL"; "NVIDIA A100-SXM4-80GB"...). Dense (no structured sparsity) bf16 and fp16
// with f32 accumulation, TFLOP/s, from NVIDIA's data sheets. The product, and its peak; nullopt
// for another GPU or dtype (f32 GEMMs have no single peak: the TF32 path is the backend's choice).
struct GpuPeak {
  const char* product;
  double dense_16bit_tflops;
};
std::optional<GpuPeak> known_gpu_peak(const std::string& gpu_name, DType dtype);

// Choices fixed when a device backend is made (use_device); backends that have no such choice
// ignore them.
struct DeviceOptions {
  CudaAttention cuda_attention = CudaAttention::flash;
  bool operator==(const DeviceOptions&) const = default;
};

// What the backend of `kind` made with `options` keeps in `att` (Note [Attention's saved state]):
// logsumexp for cuda with flash attention, probabilities otherwise. The one rule: every backend's
// attention_saved() is this function of its kind and options, and `zerone estimate` / `plan`
// count a run's activations by it without making the backend (nn::Model::count_for_device),
// so the estimate equals the ledger on a device this machine lacks too.
AttentionSaved attention_saved(DeviceKind kind, const DeviceOptions& options);

// Note [Device memory the ledger cannot see]: the ledger (core/memory.h) counts every Buffer, so
// the estimate's device bytes are the ledger's. A GPU also holds memory no Buffer owns, which the
// start-up fit check and `zerone estimate` reserve instead:
//  - the CUDA context of the process: the driver's per-context state, the SMs' local-memory
//    reserve, the device heaps and the kernel modules loaded so far (lazily: CUDA_MODULE_LOADING
//    =LAZY is Linux's default since CUDA 12.2, so only the kernels that run). Measured on an H200
//    (driver 580.159, CUDA 13.0 runtime, 2026-11-27; `zerone info`, a backend made and cuBLASLt
//    loaded, no kernel run yet): 526.8 MiB of the GPU not free. Training loads more modules
//    lazily (zerone's kernels, cuBLASLt's), not measured; kCudaContextReserveBytes is the round
//    bound 1 GiB above both. (The first form, 512 MiB, was a guess below the measurement.)
//    A live backend needs no such figure: cudaMemGetInfo's free bytes already exclude its context.
// The backend's own scratch (cuBLASLt's workspace, kCudaGemmWorkspaceBytes = 32 MiB, which every
// GEMM is handed so that cuBLASLt allocates none of its own, and the kernels' scratch slots) are
// Buffers, in the ledger's device "scratch", and counted by the estimate (Note [Backend scratch],
// kernels/scratch.h). So a run on cuda may fill with the estimate's device bytes: the free bytes
// of a GPU whose context exists (the start-up check, from the backend's cudaMemGetInfo), or total
// - kCudaContextReserveBytes of one that has none yet (`zerone estimate` and `zerone plan`, which
// never make the backend). The cpu and sim devices are host memory: their fit is the host's (Note
// [Fit] in zero/planner.h) and they report no DeviceMemory.
inline constexpr int64_t kCudaContextReserveBytes = int64_t{1024} << 20;
inline constexpr int64_t kCudaGemmWorkspaceBytes = int64_t{32} << 20;

// A GPU's memory (Note [Device memory the ledger cannot see]).
struct DeviceMemory {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;  // now, with this process's context resident
  bool measured = true;    // false: before_context's figure, not cudaMemGetInfo's
  // What a run may fill with the estimate's device bytes (its backend scratch included).
  int64_t usable_bytes() const { return std::max<int64_t>(free_bytes, 0); }
  // A GPU of `total_bytes` before this process made its context: free is total less the context
  // reserve.
  static DeviceMemory before_context(int64_t total_bytes) {
    return DeviceMemory{total_bytes, std::max<int64_t>(total_bytes - kCudaContextReserveBytes, 0), false};
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  // "cpu (oneDNN 2.6.3 ...)", "sim", "cuda:0 NVIDIA H100 ...".
  virtual std::string description() const = 0;
  // True when device memory is host memory (cpu): a communicator may then hand device buffers
  // to MPI directly instead of staging them through host buffers.
  virtual bool host_addressable() const = 0;
  // Where kernels return before they ran (a GPU's): points on the compute stream that the
  // profiler times its scopes by, and a run's summary then counts the rest of a step as the
  // device's compute (Note [Exposed time], core/profiler.h). Null where kernels run on the calling
  // thread. Owned by the backend; for the thread that drives training.
  virtual DeviceTimeline* device_timeline() { return nullptr; }
  // Where Buffers of MemPlace::device come from while this backend is installed (use_device).
  virtual MemoryArena& device_arena() = 0;
  // Note [Places of pointers]: the place of the memory at p, as CUDA's unified addressing tells a
  // device pointer from a host one: device for memory of this backend's device, host otherwise.
  // A backend whose device memory is host memory (cpu) says host for every pointer: for it the
  // distinction never changes what an operation does.
  virtual MemPlace place_of(const void* p) const = 0;
  // The choices this backend was made with (DeviceOptions; the defaults for cpu and sim).
  virtual DeviceOptions device_options() const { return {}; }
  // The device's own memory now (cuda: cudaMemGetInfo on its GPU); nullopt when device memory is
  // host memory (cpu, sim). Note [Device memory the ledger cannot see].
  virtual std::optional<DeviceMemory> device_memory() const { return std::nullopt; }
  // Whether attention with `operands` at head size hs runs in the tensor-core form on this device
  // (cuda with flash attention: where the GPU's blocks can opt into its shared memory), which
  // decides its scratch (Note [Backend scratch], kernels/scratch.h). False elsewhere.
  virtual bool tensor_core_attention(DType operands, int hs) const { return false; }
  // Note [Pinned host memory]: the arena MemPlace::host Buffers come from while this backend is
  // the device (use_device), or null for the process default (aligned_alloc). The CUDA backend
  // serves page-locked memory, so that every copy between the host and the GPU (offloaded state,
  // staged collectives) is a DMA the copy engines run without a bounce through pageable memory.
  // The optimizer's host master and moments are not from it (Note [Host state in pageable memory],
  // core/memory.h). The ledger counts these Buffers as host bytes, as any other.
  virtual MemoryArena* host_arena() { return nullptr; }
  // Returns to the device what this backend keeps for reuse (the memory its pool caches after
  // frees, the kernels' scratch slots), so that the device's free memory counts it again: for a
  // caller that used the device before a run's fit check reads that (zerone plan measuring the
  // GPU's speeds under --auto-fit). Waits for the device; no Buffer of the caller's is touched.
  virtual void release_cached_memory() {}
  // Note [Known GPU peaks]: the vendor's dense GEMM peak of this device in `dtype`, where known
  // (cuda: the GPU's, by its name); nullopt for a host device, whose peak is measured instead.
  virtual std::optional<GpuPeak> peak(DType dtype) const { return std::nullopt; }
  // What identifies this backend's physical device across processes (the GPU's UUID, hex), or ""
  // for a device every process has its own of (cpu, sim). Two ranks with the same non-empty
  // identity share one GPU (comm/comm_choice.h).
  virtual std::string device_identity() const { return ""; }
  // The library handles a stream-native communicator (NCCL, comm/nccl_communicator.h) enqueues
  // on: the device ordinal and the `cudaStream_t` of `stream`; -1 and null on the inline backends.
  virtual int native_device() const { return -1; }
  virtual void* native_stream(Stream stream) const { return nullptr; }

  // --- streams and events (Note [Streams and events]) ---
  virtual Event record(Stream stream) { return Event(); }
  // Work submitted to `stream` after this call starts after `event` completed.
  virtual void wait(Stream stream, const Event& event) {}
  // The host waits for everything submitted to `stream`.
  virtual void synchronize(Stream stream) {}

  // --- the engine's own needs ---
  // dst (bytes) = src, between any two places (device or host, as given). No overlap.
  virtual void copy(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) = 0;
  void copy_to_device(void* dst, const void* host_src, size_t bytes) { copy(dst, MemPlace::device, host_src, MemPlace::host, bytes); }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) { copy(host_dst, MemPlace::host, src, MemPlace::device, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes) { copy(dst, MemPlace::device, src, MemPlace::device, bytes); }
  // The same with each side's place told by place_of (cudaMemcpyDefault's rule).
  void copy_any(void* dst, const void* src, size_t bytes) { copy(dst, place_of(dst), src, place_of(src), bytes); }
  // Note [Asynchronous copies]: copy() that may return before the copy ran, with the Event of its
  // end. It runs after the compute work submitted so far (on a GPU, a copy with a host side on its
  // direction's copy stream, device-to-device on compute). Lifetime rule: until the event
  // completed, the caller neither reads nor frees the destination, nor writes nor frees the source.
  // The host may touch them after event.wait() (or a Work made of the event, comm/communicator.h);
  // a stream may after wait(stream, event). The cpu backend copies at once (a complete Event); the
  // simulated device defers the copy to the event's first observation and fills the destination
  // with NaN bytes meanwhile (Note [Deferred copies] in kernels/sim/sim_backend.h), so that a use
  // that breaks the rule changes the bits the tests compare.
  virtual Event copy_async(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) {
    copy(dst, dst_place, src, src_place, bytes);
    return Event();
  }
  Event copy_any_async(void* dst, const void* src, size_t bytes) {
    return copy_async(dst, place_of(dst), src, place_of(src), bytes);
  }
  // dst (bytes) = 0.
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // dst (n) += src (n).
  virtual void accumulate(float* dst, const float* src, size_t n) = 0;
  // Note [Deterministic gradient norm]: sum of x[i]^2 in double, in an order that depends only on
  // n (fixed chunks, summed in chunk order), never on the thread count. With `copy_to` (device, n),
  // x is also copied there in the same sweep. A device returns it pending (Note [Norms read once a
  // step], core/pending_sum.h): value() waits for it.
  virtual PendingSum sum_squares(const float* x, size_t n, float* copy_to = nullptr) = 0;
  // Sum of x (n) in double, in index order.
  virtual double sum(const float* x, size_t n) = 0;
  // dst (n, dst_dtype) = src (n, src_dtype), rounding to nearest even when narrowing.
  virtual void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) = 0;
  // True when every x (n) is finite.
  virtual bool all_finite(const float* x, size_t n) = 0;
  // Note [Blockwise quantization] (kernels/cpu/quantize.h), ZeRO++'s quantized collectives: out
  // (quantized_bytes(n, bits, block), kernels/cpu/quantize.h) = src (n of src_dtype) in blocks of
  // int8 or int4 codes with f32 scales; dst (n of dst_dtype) = the decoded values, or with
  // `accumulate` (f32 only) dst += them.
  virtual void quantize_blockwise(const void* src, DType src_dtype, size_t n, int bits, size_t block, void* out) = 0;
  virtual void dequantize_blockwise(const void* in, size_t n, int bits, size_t block, void* dst, DType dst_dtype,
                                    bool accumulate) = 0;

  // --- optimizer updates (kernels/cpu/adamw.h and sgd.h) ---
  // Returns the sum of squares of the unscaled gradients, pending on a device (Note [Norms read
  // once a step], core/pending_sum.h). `param` may be null.
  virtual PendingSum adamw_update(float* master, float* m, float* v, const float* grad, void* param, DType param_dtype,
                              size_t n, const AdamWHyper& hyper) = 0;
  // AdamW over several ranges in order (a unit's weight-decay and no-decay runs), each with its
  // own hyperparameters: the updates adamw_update makes range by range, and their sums added in
  // range order, so the same bits. A device copies the partials of all the ranges to the host
  // at once (Note [Updates that measure the norm]), and the host waits for them only when it
  // reads the value.
  using AdamWRange = kernels::AdamWRange;
  virtual PendingSum adamw_update_ranges(const std::vector<AdamWRange>& ranges, DType param_dtype) {
    PendingSum sumsq;
    for (const AdamWRange& r : ranges) sumsq += adamw_update(r.master, r.m, r.v, r.grad, r.param, param_dtype, r.n, r.hyper);
    return sumsq;
  }
  // `momentum` may be null (no momentum), `param` too.
  virtual PendingSum sgd_update(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n,
                            const SGDHyper& hyper) = 0;

  // --- the transformers (kernels/cpu/ops.h) ---
  // wte (V, C) is the token table (V its rows: the padded vocabulary where the table is padded),
  // wpe (>= T, C) the position table; only its first T rows are read.
  virtual void embedding_forward(float* out, const int32_t* tokens, const void* wte, const void* wpe, DType param_dtype,
                                 int B, int T, int C, int V) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                                  int C, int V) = 0;
  // Note [GEMM operands in the compute dtype]: a linear's activation operand (`inp`, and in
  // backward `dout`) is f32 or already in the weights' dtype (`inp_dtype` == param_dtype). With
  // 16-bit weights the GEMM rounds an f32 operand to their dtype first (to nearest even, core/
  // dtype.h), so an op whose output only GEMMs read may write it rounded instead: the norms, gelu
  // and swiglu forward, swiglu and cross-entropy backward take an `out_dtype` (any dtype; they
  // compute in f32 and round as they store). The GEMM then sees the same bits, and the output is
  // written, kept and read at half the bytes, with no conversion pass before each GEMM. The models
  // store the activations only GEMMs read in their compute dtype (nn/gpt2.cc, nn/llama.cc); a
  // linear with a bias needs `dout` in f32 (the bias gradient sums it unrounded). Caveats: the
  // cpu's fp16 GEMMs still widen the operand to f32 scratch (Note [fp16 on the CPU]); on cuda an
  // operand whose base is not 16-byte aligned (a layer's slot when B*T*C is not a multiple of 8)
  // may get another cuBLASLt algorithm than the aligned scratch got: the same products, summed
  // in another order.
  virtual void layernorm_forward(void* out, DType out_dtype, float* mean, float* rstd, const float* inp,
                                 const void* weight, const void* bias, DType param_dtype, int N, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                  const void* weight, DType param_dtype, const float* mean, const float* rstd, int N,
                                  int C) = 0;
  // `inp` (N, C) and `dout` (N, OC) in f32 or in param_dtype (Note [GEMM operands in the compute
  // dtype]); dbias requires dout in f32. `out` (N, OC) in f32 or in param_dtype (Note [Logits in
  // the compute dtype]): the f32 accumulators (plus the bias) rounded to nearest even as stored.
  virtual void linear_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, const void* weight,
                              const void* bias, DType param_dtype, int N, int C, int OC) = 0;
  virtual void linear_backward(float* dinp, float* dweight, float* dbias, const void* dout, DType dout_dtype,
                               const void* inp, DType inp_dtype, const void* weight, DType param_dtype, int N, int C,
                               int OC, bool accumulate_param_grads = true) = 0;
  // Note [GELU's backward in the linear's]: the backward of the linear whose output `pre` (N, OC,
  // in pre_dtype) goes through GELU (GPT-2's fc): linear_backward with dout = gelu'(pre) * dgelu,
  // dgelu (N, OC, f32) the gradient of GELU's output, which the call may overwrite (the caller
  // reads it no more). Formed this way (gelu_backward into dgelu, then linear_backward) on every
  // backend; the cuda backend fuses GELU's backward into the bias's column sums, which also store
  // the rounded operand of the GEMMs, with the same bits: one pass over (N, OC) instead of three.
  virtual void linear_backward_through_gelu(float* dinp, float* dweight, float* dbias, float* dgelu, const void* pre,
                                            DType pre_dtype, const void* inp, DType inp_dtype, const void* weight,
                                            DType param_dtype, int N, int C, int OC, bool accumulate_param_grads) {
    gelu_backward(dgelu, pre, pre_dtype, dgelu, static_cast<size_t>(N) * OC);
    linear_backward(dinp, dweight, dbias, dgelu, DType::f32, inp, inp_dtype, weight, param_dtype, N, C, OC,
                    accumulate_param_grads);
  }
  // Note [Attention's saved state]: `att` holds attention_saved_numel(attention_saved(), B, NH, T)
  // floats.
  AttentionSaved attention_saved() const { return kernels::attention_saved(kind(), device_options()); }
  // `operands`: the dtype the model computes its products in (its parameters' dtype). With bf16 or
  // f16 a backend may round attention's inner operands (the probabilities, dO, dS) to it, as
  // PyTorch's autocast does: the cuda backend's flash attention then runs on tensor cores (Note
  // [Flash attention on tensor cores], kernels/cuda/attention_tensor_cores.cu). The cpu and sim
  // backends compute in f32 whatever it says. f32 asks for f32 products everywhere.
  // Note [Attention's inputs and output in the compute dtype]: qkv and out are stored in
  // `operands` (so in bf16 or f16 in a 16-bit run): the qkv GEMM writes them rounded (Note
  // [Logits in the compute dtype]'s out_dtype), attention reads them as they are, and its output
  // is the next GEMM's operand as it is, with no conversion pass in either direction (W5: three
  // passes over qkv and two over out a layer, and 604 MB of f32 qkv and out, gone). A backend that
  // computes in f32 (cpu, sim, cuda's f32 and plain forms) widens qkv exactly and rounds out as
  // it stores it. dqkv and dout stay f32 (the qkv gradient feeds a bias gradient and rope).
  // Backward reads `out`, what forward wrote, unchanged (a backend may form rowsum(dout * out)
  // from it; the cpu's does not read it).
  virtual void attention_forward(void* out, float* att, const void* qkv, int B, int T, int C, int NH,
                                 DType operands) = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const void* qkv, const void* out, const float* att,
                                  int B, int T, int C, int NH, DType operands) = 0;
  virtual void gqa_attention_forward(void* out, float* att, const void* qkv, int B, int T, int NH, int NKV, int hs,
                                     DType operands) = 0;
  virtual void gqa_attention_backward(float* dqkv, const float* dout, const void* qkv, const void* out,
                                      const float* att, int B, int T, int NH, int NKV, int hs, DType operands) = 0;
  virtual void rmsnorm_forward(void* out, DType out_dtype, float* rstd, const float* inp, const void* weight,
                               DType param_dtype, int N, int C, float eps) = 0;
  // Note [Gradients rounded where they are made]: a linear without a bias (every LLaMA linear)
  // takes its output gradient to the backward GEMMs in the compute dtype; where that gradient is
  // f32, linear_backward would round it in a pass of its own (reading it again). In a 16-bit run
  // the op that makes it stores the rounded copy as it goes, and the model hands that copy to
  // linear_backward (dout_dtype 16-bit): rmsnorm_backward the residual stream's gradient (which
  // w_down and wo take; dinp (+)= as ever, and with `dinp_rounded` (N x C of rounded_dtype, or
  // null) the sum rounded to nearest even, as a conversion would), rope_backward the qkv gradient
  // (which w_qkv takes). The same bits reach the GEMMs as before; two passes over (N, C) and one
  // over (N, R) f32 a layer fewer (GPT-2's linears have biases, whose pass rounds on the way
  // inside the backend: Note [Rounded on the way], kernels/cuda/kernels.h).
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const void* weight,
                                DType param_dtype, const float* rstd, int N, int C, void* dinp_rounded,
                                DType rounded_dtype) = 0;
  // x in x_dtype (the qkv of Note [Attention's inputs and output in the compute dtype]): rotated
  // in f32 and stored rounded to it.
  virtual void rope_forward(void* x, DType x_dtype, const float* inv_freq, int B, int T, int stride, int heads,
                            int hs) = 0;
  // dx (B, T, stride) f32, its first `heads` heads rotated back. With dx_rounded null, in place;
  // otherwise (Note [Gradients rounded where they are made]) dx is only read and every element of
  // every row, rotated or not, goes to dx_rounded rounded to rounded_dtype.
  virtual void rope_backward(float* dx, const float* inv_freq, int B, int T, int stride, int heads, int hs,
                             void* dx_rounded, DType rounded_dtype) = 0;
  // Note [The MLP's hidden activation in the compute dtype]: the pre-activation of a block's MLP
  // (GPT-2's fch, (N, 4C); LLaMA's gate_up, (N, 2F)) is a layer's largest activation, written by
  // a GEMM and read only by the activation function's forward and backward. In a 16-bit run the
  // models keep it in the compute dtype, as PyTorch's autocast hands F.gelu and F.silu the
  // Linear's bf16 output: the GEMM rounds its f32 sums as it stores them (linear_forward's
  // out_dtype), and gelu and swiglu widen `inp` (inp_dtype) exactly and compute in f32. Their
  // outputs are as before (out: the next GEMM's operand, Note [GEMM operands in the compute
  // dtype]; dinp). Saved: GPT-2 at W5 (B 8 x T 1024) 604 MB of activations and a 4-byte write and
  // two 4-byte reads of 25 M elements a layer, Llama-3.2-1B at B 4 x T 2048 4.3 GB. In fp16 the
  // stored value has fp16's range: a pre-activation past -65504 becomes -inf and its GELU or SiLU
  // NaN (in f32 it was 0), as with autocast; a run that far gone has diverged anyway.
  // swiglu: inp (N, 2F), gate then up in each row; out (N, F) = silu(gate) * up.
  virtual void swiglu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, int N, int F) = 0;
  virtual void swiglu_backward(void* dinp, DType dinp_dtype, const float* dout, const void* inp, DType inp_dtype, int N,
                               int F) = 0;
  // gelu (the tanh form, GPT-2's) of n elements. dinp may alias dout.
  virtual void gelu_forward(void* out, DType out_dtype, const void* inp, DType inp_dtype, size_t n) = 0;
  virtual void gelu_backward(float* dinp, const void* inp, DType inp_dtype, const float* dout, size_t n) = 0;
  virtual void residual_forward(float* out, const float* a, const float* b, size_t n) = 0;
  // Note [Logits in the compute dtype]: a language model's logits (N, Vp) are the largest
  // activation (GPT-2 at B 8 x T 1024: 1.65 GB in f32; Llama-3.2-1B at B 4 x T 2048: 4.2 GB), and
  // the head's GEMM, the cross-entropy forward and its backward each pass over them. In a 16-bit
  // run the models keep them in the compute dtype, as PyTorch's autocast hands F.cross_entropy
  // the lm head's bf16 output: the head's GEMM rounds its f32 accumulators as it stores them
  // (linear_forward's out_dtype), the cross-entropy reads them widened and computes in f32, and
  // its backward writes dlogits over them in the same dtype (the head's backward GEMMs read them
  // so, Note [GEMM operands in the compute dtype]). One (N, Vp) buffer of 2-byte elements instead
  // of an f32 one and a 16-bit dlogits beside it: at GPT-2's W5 shape 1.65 GB less memory and 2.5
  // GB less traffic a step. f32 runs keep f32 logits, in place as before. What it changes: the
  // loss is computed from the rounded logits (relative 2^-9 in bf16), sampling reads them (ties and
  // top-k cut-offs move with the rounding), and fp16 logits beyond 65504 would be inf (PyTorch's
  // autocast shares all three). The fallback forms that make a 16-bit output from an f32 GEMM
  // (no 16-bit algorithm, a bias, an AMX CPU's column tails) do it in bounded bands, never an
  // (N, Vp) f32 scratch.
  // `logits` (N, Vp) in `logits_dtype` (f32, bf16 or f16).
  virtual void crossentropy_forward(float* losses, float* lse, const void* logits, DType logits_dtype,
                                    const int32_t* targets, int N, int V, int Vp) = 0;
  // dlogits may be logits itself (in place) when the two dtypes are the same.
  virtual void crossentropy_backward(void* dlogits, DType dlogits_dtype, const void* logits, DType logits_dtype,
                                     const float* lse, const int32_t* targets, float dloss, int N, int V, int Vp) = 0;

  // --- the image classifiers (kernels/cpu/classifier.h, conv.h) ---
  virtual void relu_forward(float* out, const float* inp, size_t n) = 0;
  virtual void relu_backward(float* dinp, const float* dout, const float* out, size_t n) = 0;
  virtual void dropout_forward(float* out, const float* inp, int N, size_t per_sample, float p,
                               const DropoutKey& key) = 0;
  virtual void dropout_backward(float* dinp, const float* dout, int N, size_t per_sample, float p,
                                const DropoutKey& key) = 0;
  // Returns the mean loss (host); `correct` (host, may be null) receives the argmax hits.
  virtual float softmax_cross_entropy_forward(float* probs, float* losses, const float* logits, const int32_t* labels,
                                              int N, int K, int64_t* correct = nullptr) = 0;
  virtual void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int N, int K,
                                              float scale) = 0;
  // Channels per block of ActLayout::blocked on this backend, or 0 when it keeps layouts plain.
  virtual int activation_channel_block() = 0;
  // Floats of one sample (C, H, W) held in `layout`.
  virtual size_t activation_numel(int C, int H, int W, ActLayout layout) = 0;
  virtual void activation_to_plain(float* out, const float* blocked, int N, int C, int H, int W) = 0;
  virtual void activation_to_blocked(float* out, const float* plain, int N, int C, int H, int W) = 0;
  virtual void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                              const Conv2dShape& s) = 0;
  virtual void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, const Conv2dShape& s, bool accumulate_param_grads = true) = 0;
  virtual size_t maxpool2d_workspace_bytes(const Pool2dShape& s) = 0;
  virtual void maxpool2d_forward(float* out, void* workspace, const float* inp, const Pool2dShape& s) = 0;
  virtual void maxpool2d_backward(float* dinp, const float* dout, const void* workspace, const Pool2dShape& s) = 0;
};

// The backends this build can use on this machine, in preference order (cuda first when a GPU is
// present and the CUDA backend is built; cpu and sim always).
std::vector<DeviceKind> available_devices();
// The default device: cuda when available, else cpu.
DeviceKind default_device();

// The process-wide backend of `kind` (created on first use). Throws Error for a device this build
// or machine cannot provide (cuda without a GPU or without the CUDA backend built).
Backend& backend(DeviceKind kind);
// The backend that runs operations on host memory: the cpu backend. Optimizers whose state is
// offloaded to the host (and the engine's host-side work) use it on any device.
Backend& host_backend();

// Makes `kind` the process's device: its arena serves MemPlace::device Buffers from now on (and its
// host_arena(), where it has one, the MemPlace::host ones), and device_backend() returns it. Call at
// start-up before any device Buffer exists. The process-wide backend of `kind` is made with `options`
// (backend(kind) makes it with the defaults); asking for other options after it exists is an internal error.
Backend& use_device(DeviceKind kind, const DeviceOptions& options = {});
// The device backend in use (cpu until use_device says otherwise).
Backend& device_backend();

// The memory of `kind`'s device for a run that has not made its backend: the backend's
// device_memory() when it exists already, else for cuda with a GPU present the GPU this process
// would use (GPU 0's total, DeviceMemory::before_context), else nullopt (cpu, sim, no GPU).
// Never makes a backend (no CUDA context).
std::optional<DeviceMemory> device_memory(DeviceKind kind);

// The backend whose operations run on memory of `place` (device: device_backend(); host:
// host_backend()).
inline Backend& backend_for(MemPlace place) { return place == MemPlace::host ? host_backend() : device_backend(); }

}  // namespace zerone::kernels
