// The simulated device (kernels/backend.h, `--device sim`): device memory that host code cannot
// touch, so any access to device memory that does not go through the backend crashes at once.
//
// Note [Simulated device memory]: the device's memory is one memfd mapped twice. Buffers get
// addresses in the first mapping, which is PROT_NONE: the CPU faults on any load or store there.
// The backend alone knows the second, read-write mapping of the same pages; every operation
// translates its device operands into it (checking that each one is device memory) and runs the
// cpu kernels there, so results are bit for bit the cpu backend's. Freed ranges are punched out of
// the memfd (the pages go back to the system and read as zero when handed out again), which keeps
// the arena's zero-fill contract without a host write.
//
// Thread-safety: as Backend. The arena is locked (the communication thread allocates staging).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "zerone/kernels/backend.h"
#include "zerone/kernels/cpu/cpu_backend.h"

namespace zerone::kernels::sim {

// The simulated device's memory (Note [Simulated device memory]).
class SimArena final : public MemoryArena {
 public:
  // Reserves `capacity_bytes` of address space (nothing resident until written). Throws Error
  // when the system refuses the memfd or the mappings.
  explicit SimArena(size_t capacity_bytes);
  ~SimArena() override;
  SimArena(const SimArena&) = delete;
  SimArena& operator=(const SimArena&) = delete;

  // Page-aligned, zero-filled ranges of the PROT_NONE mapping; nullptr when the range is full.
  void* allocate(size_t bytes, size_t alignment) override;
  void deallocate(void* data, size_t bytes, size_t alignment) noexcept override;
  void zero(void* data, size_t bytes) override;

  // True when [p, p + bytes) lies inside the device mapping.
  bool contains(const void* p, size_t bytes = 1) const;
  // The backend's view of device address p (aborts, naming `what`, when p is not device memory).
  void* translate(const void* p, size_t bytes, const char* what) const;

 private:
  int fd_ = -1;
  size_t capacity_ = 0;
  char* device_ = nullptr;  // PROT_NONE view: what Buffers hold
  char* shadow_ = nullptr;  // read-write view: what the kernels touch
  mutable std::mutex mutex_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
};

class SimBackend final : public Backend {
 public:
  SimBackend();
  DeviceKind kind() const override { return DeviceKind::sim; }
  std::string description() const override;
  bool host_addressable() const override { return false; }
  MemoryArena& device_arena() override { return arena_; }
  SimArena& arena() { return arena_; }

  void copy(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void accumulate(float* dst, const float* src, size_t n) override;
  double sum_squares(const float* x, size_t n, float* copy_to = nullptr) override;
  double sum(const float* x, size_t n) override;
  void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) override;
  bool all_finite(const float* x, size_t n) override;

  double adamw_update(float* master, float* m, float* v, const float* grad, void* param, DType param_dtype, size_t n,
                      const AdamWHyper& hyper) override;
  double sgd_update(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n,
                    const SGDHyper& hyper) override;

  void embedding_forward(float* out, const int32_t* tokens, const void* wte, const void* wpe, DType param_dtype, int B,
                         int T, int C) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                          int C) override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const void* weight, const void* bias,
                         DType param_dtype, int N, int C) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const void* weight, DType param_dtype, const float* mean, const float* rstd, int N,
                          int C) override;
  void linear_forward(float* out, const float* inp, const void* weight, const void* bias, DType param_dtype, int N,
                      int C, int OC) override;
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const void* weight, DType param_dtype, int N, int C, int OC,
                       bool accumulate_param_grads = true) override;
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) override;
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                          int NH) override;
  void gqa_attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int NKV,
                             int hs) override;
  void gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int NH,
                              int NKV, int hs) override;
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const void* weight, DType param_dtype, int N, int C,
                       float eps) override;
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const void* weight,
                        DType param_dtype, const float* rstd, int N, int C) override;
  void rope_forward(float* x, const float* inv_freq, int B, int T, int stride, int heads, int hs) override;
  void rope_backward(float* dx, const float* inv_freq, int B, int T, int stride, int heads, int hs) override;
  void swiglu_forward(float* out, const float* inp, int N, int F) override;
  void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int F) override;
  void gelu_forward(float* out, const float* inp, size_t n) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override;
  void residual_forward(float* out, const float* a, const float* b, size_t n) override;
  void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int N, int V,
                            int Vp) override;
  void crossentropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets,
                             float dloss, int N, int V, int Vp) override;

  void relu_forward(float* out, const float* inp, size_t n) override;
  void relu_backward(float* dinp, const float* dout, const float* out, size_t n) override;
  void dropout_forward(float* out, const float* inp, int N, size_t per_sample, float p, const DropoutKey& key) override;
  void dropout_backward(float* dinp, const float* dout, int N, size_t per_sample, float p,
                        const DropoutKey& key) override;
  float softmax_cross_entropy_forward(float* probs, float* losses, const float* logits, const int32_t* labels, int N,
                                      int K, int64_t* correct = nullptr) override;
  void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int N, int K,
                                      float scale) override;
  int activation_channel_block() override;
  size_t activation_numel(int C, int H, int W, ActLayout layout) override;
  void activation_to_plain(float* out, const float* blocked, int N, int C, int H, int W) override;
  void activation_to_blocked(float* out, const float* plain, int N, int C, int H, int W) override;
  void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                      const Conv2dShape& s) override;
  void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const Conv2dShape& s, bool accumulate_param_grads = true) override;
  size_t maxpool2d_workspace_bytes(const Pool2dShape& s) override;
  void maxpool2d_forward(float* out, void* workspace, const float* inp, const Pool2dShape& s) override;
  void maxpool2d_backward(float* dinp, const float* dout, const void* workspace, const Pool2dShape& s) override;

 private:
  // Device operand p (null stays null), translated into the backend's view.
  template <typename T> T* dev(T* p) const {
    return p ? static_cast<T*>(arena_.translate(p, 1, "operand")) : nullptr;
  }
  SimArena arena_;
  cpu::CpuBackend cpu_;
};

}  // namespace zerone::kernels::sim
