#include "zerone/kernels/sim/sim_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "zerone/core/error.h"

namespace zerone::kernels::sim {

namespace {
constexpr size_t kPage = 4096;
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

SimArena::SimArena(size_t capacity_bytes) : capacity_(round_up(capacity_bytes, kPage)) {
  fd_ = ::memfd_create("zerone-sim-device", MFD_CLOEXEC);
  ZERONE_CHECK(fd_ >= 0, "--device sim: memfd_create failed: ", std::strerror(errno));
  ZERONE_CHECK(::ftruncate(fd_, static_cast<off_t>(capacity_)) == 0, "--device sim: cannot size the simulated device to ",
               capacity_, " bytes: ", std::strerror(errno));
  void* device = ::mmap(nullptr, capacity_, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  void* shadow = ::mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
  ZERONE_CHECK(device != MAP_FAILED && shadow != MAP_FAILED, "--device sim: cannot map the simulated device: ",
               std::strerror(errno));
  device_ = static_cast<char*>(device);
  shadow_ = static_cast<char*>(shadow);
  free_.emplace(0, capacity_);
}

SimArena::~SimArena() {
  if (device_) ::munmap(device_, capacity_);
  if (shadow_) ::munmap(shadow_, capacity_);
  if (fd_ >= 0) ::close(fd_);
}

void* SimArena::allocate(size_t bytes, size_t alignment) {
  const size_t need = round_up(std::max<size_t>(bytes, 1), kPage);
  ZERONE_ASSERT(alignment <= kPage, "sim: alignment ", alignment, " above a page");
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {  // first fit
    if (it->second < need) continue;
    const size_t offset = it->first, left = it->second - need;
    free_.erase(it);
    if (left > 0) free_.emplace(offset + need, left);
    return device_ + offset;
  }
  return nullptr;
}

void SimArena::deallocate(void* data, size_t bytes, size_t) noexcept {
  if (data == nullptr) return;
  const size_t offset = static_cast<char*>(data) - device_, size = round_up(std::max<size_t>(bytes, 1), kPage);
  // The pages go back to the system and read as zero next time (the arena's zero-fill contract).
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset), static_cast<off_t>(size)) != 0)
    std::memset(shadow_ + offset, 0, size);
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = free_.emplace(offset, size);
  ZERONE_ASSERT(inserted, "sim: double free at device offset ", offset);
  if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

void SimArena::zero(void* data, size_t bytes) { std::memset(translate(data, bytes, "zero"), 0, bytes); }

bool SimArena::contains(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  return c >= device_ && c < device_ + capacity_ && bytes <= static_cast<size_t>(device_ + capacity_ - c);
}

void* SimArena::translate(const void* p, size_t bytes, const char* what) const {
  if (!contains(p, bytes)) {
    // An internal invariant: a host pointer reached a device operand (or a range runs off the end).
    std::fprintf(stderr, "zerone: internal error: --device sim: %s %p (%zu bytes) is not device memory\n", what, p, bytes);
    std::abort();
  }
  return shadow_ + (static_cast<const char*>(p) - device_);
}

namespace {
// Address space reserved for the simulated device: twice the machine's memory, so that any run
// the cpu device can hold fits (nothing is resident until written).
size_t sim_capacity_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const size_t physical = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : size_t{64} << 30;
  return 2 * physical;
}
}  // namespace

SimBackend::SimBackend() : arena_(sim_capacity_bytes()) {}

std::string SimBackend::description() const { return str_cat("sim (simulated device over ", cpu_.description(), ")"); }

void SimBackend::copy(void* dst, MemPlace dst_place, const void* src, MemPlace src_place, size_t bytes) {
  if (bytes == 0) return;
  void* d = dst_place == MemPlace::device ? arena_.translate(dst, bytes, "copy destination") : dst;
  const void* s = src_place == MemPlace::device ? arena_.translate(src, bytes, "copy source") : src;
  if (dst_place != MemPlace::device) ZERONE_ASSERT(!arena_.contains(dst), "sim: copy to host memory given a device address");
  if (src_place != MemPlace::device) ZERONE_ASSERT(!arena_.contains(src), "sim: copy from host memory given a device address");
  cpu_.copy(d, MemPlace::host, s, MemPlace::host, bytes);
}

void SimBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes > 0) cpu_.fill_zero(arena_.translate(dst, bytes, "fill_zero"), bytes);
}

void SimBackend::accumulate(float* dst, const float* src, size_t n) {
  if (n > 0) cpu_.accumulate(dev(dst), dev(src), n);
}

double SimBackend::sum_squares(const float* x, size_t n, float* copy_to) {
  return n > 0 ? cpu_.sum_squares(dev(x), n, dev(copy_to)) : 0.0;
}

double SimBackend::sum(const float* x, size_t n) { return n > 0 ? cpu_.sum(dev(x), n) : 0.0; }

void SimBackend::convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) {
  if (n > 0) cpu_.convert(dev(dst), dst_dtype, dev(src), src_dtype, n);
}

bool SimBackend::all_finite(const float* x, size_t n) { return n == 0 || cpu_.all_finite(dev(x), n); }

double SimBackend::adamw_update(float* master, float* m, float* v, const float* grad, void* param, DType param_dtype, size_t n, const AdamWHyper& hyper) {
  return cpu_.adamw_update(dev(master), dev(m), dev(v), dev(grad), dev(param), param_dtype, n, hyper);
}

double SimBackend::sgd_update(float* master, float* momentum, const float* grad, void* param, DType param_dtype, size_t n, const SGDHyper& hyper) {
  return cpu_.sgd_update(dev(master), dev(momentum), dev(grad), dev(param), param_dtype, n, hyper);
}

void SimBackend::embedding_forward(float* out, const int32_t* tokens, const void* wte, const void* wpe, DType param_dtype, int B, int T, int C) {
  cpu_.embedding_forward(dev(out), dev(tokens), dev(wte), dev(wpe), param_dtype, B, T, C);
}

void SimBackend::embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  cpu_.embedding_backward(dev(dwte), dev(dwpe), dev(dout), dev(tokens), B, T, C);
}

void SimBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const void* weight, const void* bias, DType param_dtype, int N, int C) {
  cpu_.layernorm_forward(dev(out), dev(mean), dev(rstd), dev(inp), dev(weight), dev(bias), param_dtype, N, C);
}

void SimBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const void* weight, DType param_dtype, const float* mean, const float* rstd, int N, int C) {
  cpu_.layernorm_backward(dev(dinp), dev(dweight), dev(dbias), dev(dout), dev(inp), dev(weight), param_dtype, dev(mean), dev(rstd), N, C);
}

void SimBackend::linear_forward(float* out, const float* inp, const void* weight, const void* bias, DType param_dtype, int N, int C, int OC) {
  cpu_.linear_forward(dev(out), dev(inp), dev(weight), dev(bias), param_dtype, N, C, OC);
}

void SimBackend::linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const void* weight, DType param_dtype, int N, int C, int OC, bool accumulate_param_grads) {
  cpu_.linear_backward(dev(dinp), dev(dweight), dev(dbias), dev(dout), dev(inp), dev(weight), param_dtype, N, C, OC, accumulate_param_grads);
}

void SimBackend::attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  cpu_.attention_forward(dev(out), dev(att), dev(qkv), B, T, C, NH);
}

void SimBackend::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH) {
  cpu_.attention_backward(dev(dqkv), dev(dout), dev(qkv), dev(att), B, T, C, NH);
}

void SimBackend::gqa_attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int NKV, int hs) {
  cpu_.gqa_attention_forward(dev(out), dev(att), dev(qkv), B, T, NH, NKV, hs);
}

void SimBackend::gqa_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int NH, int NKV, int hs) {
  cpu_.gqa_attention_backward(dev(dqkv), dev(dout), dev(qkv), dev(att), B, T, NH, NKV, hs);
}

void SimBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, const void* weight, DType param_dtype, int N, int C, float eps) {
  cpu_.rmsnorm_forward(dev(out), dev(rstd), dev(inp), dev(weight), param_dtype, N, C, eps);
}

void SimBackend::rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const void* weight, DType param_dtype, const float* rstd, int N, int C) {
  cpu_.rmsnorm_backward(dev(dinp), dev(dweight), dev(dout), dev(inp), dev(weight), param_dtype, dev(rstd), N, C);
}

void SimBackend::rope_forward(float* x, const float* inv_freq, int B, int T, int stride, int heads, int hs) {
  cpu_.rope_forward(dev(x), dev(inv_freq), B, T, stride, heads, hs);
}

void SimBackend::rope_backward(float* dx, const float* inv_freq, int B, int T, int stride, int heads, int hs) {
  cpu_.rope_backward(dev(dx), dev(inv_freq), B, T, stride, heads, hs);
}

void SimBackend::swiglu_forward(float* out, const float* inp, int N, int F) {
  cpu_.swiglu_forward(dev(out), dev(inp), N, F);
}

void SimBackend::swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int F) {
  cpu_.swiglu_backward(dev(dinp), dev(dout), dev(inp), N, F);
}

void SimBackend::gelu_forward(float* out, const float* inp, size_t n) {
  cpu_.gelu_forward(dev(out), dev(inp), n);
}

void SimBackend::gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  cpu_.gelu_backward(dev(dinp), dev(inp), dev(dout), n);
}

void SimBackend::residual_forward(float* out, const float* a, const float* b, size_t n) {
  cpu_.residual_forward(dev(out), dev(a), dev(b), n);
}

void SimBackend::crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int N, int V, int Vp) {
  cpu_.crossentropy_forward(dev(losses), dev(lse), dev(logits), dev(targets), N, V, Vp);
}

void SimBackend::crossentropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets, float dloss, int N, int V, int Vp) {
  cpu_.crossentropy_backward(dev(dlogits), dev(logits), dev(lse), dev(targets), dloss, N, V, Vp);
}

void SimBackend::relu_forward(float* out, const float* inp, size_t n) {
  cpu_.relu_forward(dev(out), dev(inp), n);
}

void SimBackend::relu_backward(float* dinp, const float* dout, const float* out, size_t n) {
  cpu_.relu_backward(dev(dinp), dev(dout), dev(out), n);
}

void SimBackend::dropout_forward(float* out, const float* inp, int N, size_t per_sample, float p, const DropoutKey& key) {
  cpu_.dropout_forward(dev(out), dev(inp), N, per_sample, p, key);
}

void SimBackend::dropout_backward(float* dinp, const float* dout, int N, size_t per_sample, float p, const DropoutKey& key) {
  cpu_.dropout_backward(dev(dinp), dev(dout), N, per_sample, p, key);
}

float SimBackend::softmax_cross_entropy_forward(float* probs, float* losses, const float* logits, const int32_t* labels, int N, int K, int64_t* correct) {
  return cpu_.softmax_cross_entropy_forward(dev(probs), dev(losses), dev(logits), dev(labels), N, K, correct);
}

void SimBackend::softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int N, int K, float scale) {
  cpu_.softmax_cross_entropy_backward(dev(dlogits), dev(probs), dev(labels), N, K, scale);
}

int SimBackend::activation_channel_block() {
  return cpu_.activation_channel_block();
}

size_t SimBackend::activation_numel(int C, int H, int W, ActLayout layout) {
  return cpu_.activation_numel(C, H, W, layout);
}

void SimBackend::activation_to_plain(float* out, const float* blocked, int N, int C, int H, int W) {
  cpu_.activation_to_plain(dev(out), dev(blocked), N, C, H, W);
}

void SimBackend::activation_to_blocked(float* out, const float* plain, int N, int C, int H, int W) {
  cpu_.activation_to_blocked(dev(out), dev(plain), N, C, H, W);
}

void SimBackend::conv2d_forward(float* out, const float* inp, const float* weight, const float* bias, const Conv2dShape& s) {
  cpu_.conv2d_forward(dev(out), dev(inp), dev(weight), dev(bias), s);
}

void SimBackend::conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, const Conv2dShape& s, bool accumulate_param_grads) {
  cpu_.conv2d_backward(dev(dinp), dev(dweight), dev(dbias), dev(dout), dev(inp), dev(weight), s, accumulate_param_grads);
}

size_t SimBackend::maxpool2d_workspace_bytes(const Pool2dShape& s) {
  return cpu_.maxpool2d_workspace_bytes(s);
}

void SimBackend::maxpool2d_forward(float* out, void* workspace, const float* inp, const Pool2dShape& s) {
  cpu_.maxpool2d_forward(dev(out), dev(workspace), dev(inp), s);
}

void SimBackend::maxpool2d_backward(float* dinp, const float* dout, const void* workspace, const Pool2dShape& s) {
  cpu_.maxpool2d_backward(dev(dinp), dev(dout), dev(workspace), s);
}

}  // namespace zerone::kernels::sim
