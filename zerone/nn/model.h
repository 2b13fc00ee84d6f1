// Model: what the ZeRO engine, the estimator and the trainer see of a network (DESIGN §2). A model
// is an ordered list of units with flat parameters (flat_param.h), a forward that returns the mean
// loss, a backward that accumulates gradients, hooks around each unit's use (UnitHooks, for ZeRO's
// gather/release/reduce), and a table of the activation memory a shape needs.
//
// Where a model plugs in: implement Model in zerone/nn (gpt2.h and llama.h are the transformers,
// sequential.h the image classifiers), add its spec to make_model (models.cc), and its tensor
// names to zerone/io for checkpoints. Nothing in zerone/zero or zerone/train names a concrete model.
//
// Note [Batches]: a model reads one kind of sample (input_kind()): token sequences with their
// next-token targets (the language models), or dense f32 feature tensors of input_shape() with one
// class label each (the classifiers). A Batch carries either; the trainer's batch sources
// (train/batch_source.h) fill it, and forward(const Batch&) is the one entry point the trainer uses.
//
// Note [Models and their device]: a model computes on the device backend in use when it is built
// (kernels::device_backend(), chosen by --device), where its parameters, gradients and activations
// live (Buffers of MemPlace::device). Every operation on them goes through that backend; the model
// never reads or writes device memory from the host. Pointers it hands out (logits()) are device
// memory: read them with backend().copy_to_host.
//
// Thread-safety: one thread drives a model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "zerone/core/dtype.h"
#include "zerone/core/error.h"
#include "zerone/core/memory.h"
#include "zerone/kernels/backend.h"
#include "zerone/kernels/scratch.h"
#include "zerone/nn/flat_param.h"

namespace zerone::nn {

// Callbacks around each unit's use. Default: do nothing (a single rank owns everything).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_forward(int unit) {}
  virtual void after_forward(int unit) {}
  virtual void before_backward(int unit) {}
  // The unit's gradients are complete for this micro-step.
  virtual void after_backward(int unit) {}
};

enum class InputKind { tokens, features };

// One micro-batch (Note [Batches]). Pointers are borrowed for the duration of forward().
struct Batch {
  int size = 0;                      // B: sequences or samples
  int seq = 1;                       // T: tokens per sequence (1 for feature samples)
  const int32_t* tokens = nullptr;   // (B,T) token ids                   [tokens]
  const float* features = nullptr;   // (B, prod(input_shape())) inputs   [features]
  const int32_t* targets = nullptr;  // (B,T) next tokens, or (B) labels; null: no loss, no backward
  // Training forward (dropout active) or evaluation. Note [Dropout keys] in kernels/types.h:
  // the run's seed, the step and the position of sample 0 in the step's global batch key the masks.
  bool training = false;
  uint64_t seed = 0;
  uint64_t step = 0;
  uint64_t first_sample = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  // The backend of the device this model's memory lives on (Note [Models and their device]).
  kernels::Backend& backend() const { return backend_; }

  // The spec string that builds this model again ("gpt2:layers=...", "llama:...").
  virtual std::string spec() const = 0;
  virtual size_t num_parameters() const = 0;
  virtual int vocab_size() const = 0;         // token ids (class labels, for classifiers) must be below this
  virtual int max_seq_len() const = 0;        // the context length (1 for classifiers)
  virtual InputKind input_kind() const { return InputKind::tokens; }
  // features: one sample's shape, e.g. {C, H, W}; tokens: empty.
  virtual std::vector<int64_t> input_shape() const { return {}; }
  virtual DType compute_dtype() const = 0;

  virtual std::vector<FlatParam>& units() = 0;
  virtual const std::vector<FlatParam>& units() const = 0;
  int num_units() const { return static_cast<int>(units().size()); }
  // Unpadded elements of each unit, in unit order.
  std::vector<size_t> unit_numels() const;
  // The units whose parameters (and gradients) unit u's forward/backward touches: {u}, plus any
  // unit whose tensor it shares (a tied head reads the embedding).
  virtual std::vector<int> units_touched(int u) const = 0;
  virtual void set_hooks(UnitHooks* hooks) = 0;

  // Deterministic initialization of one unit (storage allocated), from (seed, unit, tensor, element).
  // Writes the parameters from the host: on a device the host cannot address, run it inside
  // write_params_from_host.
  virtual void init_unit(int unit, uint64_t seed) = 0;
  // init_unit for every unit, on any device (through write_params_from_host). Storage allocated.
  void init_weights(uint64_t seed) {
    for (int u = 0; u < num_units(); ++u) write_params_from_host(u, [&] { init_unit(u, seed); });
  }
  // Note [Materializing on a device]: initialization and the checkpoint readers write a unit's
  // parameters through host pointers. Runs `write`, which fills unit u's parameter storage so,
  // with that storage in host memory when the model's device is not host-addressable, and then
  // copies it whole into the unit's device storage (its own if it had one, else a new device
  // buffer); on a host-addressable device `write` fills the device storage in place (allocated
  // first if the unit had none). Failure: throws what `write` or an allocation throws.
  void write_params_from_host(int u, const std::function<void()>& write);

  // inputs (B,T) token ids < vocab_size() (validated by the caller). With targets returns the mean
  // cross-entropy over B*T and keeps what backward needs; without, computes logits only, returns 0.
  virtual float forward(const int32_t* inputs, const int32_t* targets, int B, int T) = 0;
  // The trainer's entry point (Note [Batches]). The default serves token models: it calls the
  // forward above with the batch's tokens and targets. Classifiers return the mean cross-entropy
  // over the batch's labels; their logits() are (B, vocab_size()).
  virtual float forward(const Batch& batch);
  // Accumulates into every unit's gradient the gradient of (grad_scale * mean loss).
  virtual void backward(float grad_scale) = 0;
  void zero_grad() {
    for (FlatParam& unit : units()) unit.zero_grad();
  }
  // Logits (B,T,logits_stride()) of the last forward, in device memory, elements of
  // logits_dtype(); the first vocab_size() columns are real.
  virtual const void* logits() const = 0;
  virtual int logits_stride() const = 0;
  // f32, or the compute dtype of a 16-bit language model (Note [Logits in the compute dtype],
  // kernels/backend.h).
  virtual DType logits_dtype() const { return DType::f32; }
  // Rows first_row .. first_row + rows - 1 of logits() (logits_stride() elements each) copied to
  // the host and widened to f32 (exactly). Failure: what the backend's copy throws.
  std::vector<float> logits_to_host(size_t first_row, size_t rows) const;

  // Note [Activation checkpointing]: with it on, forward keeps each block's input (the residual
  // stream between blocks) and one block's worth of internals; backward recomputes a block's
  // forward from its input just before that block's backward. The recomputation runs the same
  // kernels on the same inputs and parameters, so losses and gradients are bitwise those without
  // it; activation memory drops from L blocks' internals to one, for about one extra forward.
  virtual void set_activation_checkpointing(bool on) = 0;
  virtual bool activation_checkpointing() const = 0;

  // Note [CPU checkpointing]: DeepSpeed's activation_checkpointing.cpu_checkpointing. With
  // checkpointing on, the saved block inputs (L-1 copies of the (B,T,C) residual stream) live in
  // the host place instead of the device: forward computes each block's output in one of two
  // device slots and copies it to the host; backward copies a block's input back into its device
  // slot just before recomputing the block. The copies are exact, so losses and gradients are
  // bitwise those without it; the device holds two slots instead of L, which is what lets a
  // larger batch or sequence fit under --device-mem-limit (the host pays the rest). It has an
  // effect only together with checkpointing. The default refuses (models without blocks).
  virtual void set_cpu_checkpointing(bool on);
  virtual bool cpu_checkpointing() const { return false; }

  // Bytes of activations (and backward temporaries) forward/backward at (B, T) allocate: the same
  // table sizes the buffers, so `zerone estimate` and the ledger agree. Throws Error for a shape
  // beyond any machine (sizes that would overflow).
  virtual size_t activation_bytes(int B, int T) const = 0;
  // The part of activation_bytes(B, T) that lives in the host place (Note [CPU checkpointing]);
  // the rest is on the device.
  virtual size_t host_activation_bytes(int /*B*/, int /*T*/) const { return 0; }

  // The device a model's memory is counted for: the backend installed when it was built, or, for
  // a model without storage (make_model(..., allocate=false)) that estimates a run on another
  // device (`zerone estimate --device cuda` on a machine without a GPU), the one it is told by
  // count_for_device. It decides what attention keeps for backward (Note [Attention's saved
  // state], kernels/backend.h) in the activation table and the buffers, and the backend's own
  // scratch (scratch_bytes). Allocating activations counted for another device than the
  // backend's is an internal error.
  void count_for_device(kernels::DeviceKind kind, const kernels::DeviceOptions& options) {
    counted_kind_ = kind;
    counted_options_ = options;
    attention_saved_ = kernels::attention_saved(kind, options);
  }
  kernels::AttentionSaved attention_saved() const { return attention_saved_; }

  // Note [Backend scratch] (kernels/scratch.h): the scratch the counted device's backend keeps for
  // this model's operations at (B, T): forward (with the loss), backward and the recomputation.
  // Counted for the backend itself where it is the counted device (Note [Backend scratch]).
  kernels::ScratchCount scratch_count(int B, int T) const {
    const bool live = counted_kind_ == backend_.kind() && counted_options_ == backend_.device_options();
    kernels::ScratchCount count(counted_kind_, counted_options_, live ? &backend_ : nullptr);
    count_scratch(count, B, T);
    return count;
  }

 protected:
  // Every backend operation forward(B, T) and backward() call that keeps scratch, counted into
  // `count` with the arguments they pass (the ScratchCount call of the same name).
  virtual void count_scratch(kernels::ScratchCount& count, int B, int T) const = 0;

  kernels::Backend& backend_ = kernels::device_backend();
  kernels::DeviceKind counted_kind_ = backend_.kind();
  kernels::DeviceOptions counted_options_ = backend_.device_options();
  kernels::AttentionSaved attention_saved_ = backend_.attention_saved();
  // attention_saved_ for sizing buffers on the backend: its own form, or an internal error.
  kernels::AttentionSaved allocated_attention_saved() const {
    ZERONE_ASSERT(attention_saved_ == backend_.attention_saved(), "a model counted for another device "
                  "(count_for_device) allocates its activations on ", backend_.description());
    return attention_saved_;
  }
};

// The plumbing every transformer here shares: the units, the compute dtype, the hooks, the
// checkpointing switch, and the fresh-gradient rule. GPT-2 and LLaMA derive from it.
// One activation buffer of a model's table (nn/gpt2.cc, nn/llama.cc): its element count and
// element size (Note [GEMM operands in the compute dtype], kernels/backend.h: some are 16-bit).
struct ActivationBuffer {
  size_t numel, elem_bytes;
};

class UnitModel : public Model {
 public:
  DType compute_dtype() const override { return dtype_; }
  std::vector<FlatParam>& units() override { return units_; }
  const std::vector<FlatParam>& units() const override { return units_; }
  void set_hooks(UnitHooks* hooks) override { hooks_ = hooks ? hooks : &default_hooks_; }
  void set_activation_checkpointing(bool on) override { checkpointing_ = on; }
  bool activation_checkpointing() const override { return checkpointing_; }
  void set_cpu_checkpointing(bool on) override { cpu_checkpointing_ = on; }
  bool cpu_checkpointing() const override { return cpu_checkpointing_; }

  // Elements of the device block-output slots and of their host copies for L blocks of BTC floats
  // (Note [CPU checkpointing]; the activation tables of the transformers use them).
  static size_t output_slots_numel(bool on_host, size_t L, size_t BTC) { return (on_host ? std::min<size_t>(L, 2) : L) * BTC; }
  static size_t saved_inputs_numel(bool on_host, size_t L, size_t BTC) { return on_host && L > 0 ? (L - 1) * BTC : 0; }

 protected:
  explicit UnitModel(DType dtype) : dtype_(dtype) {}
  const void* p(int unit, int tensor) const { return units_[unit].param(tensor); }
  float* g(int unit, int tensor) { return units_[unit].grad(tensor); }
  // Note [Fresh gradients]: when unit u's gradient buffer is fresh, zeroes every tensor's gradient
  // but those in `overwritten` (which the caller's GEMMs will write) and the padding, and returns
  // false: the GEMMs must overwrite. Otherwise returns true (accumulate).
  bool accumulate_grads(int u, std::initializer_list<int> overwritten);

  // Note [CPU checkpointing], shared by the transformers. `outputs` holds the block outputs on the
  // device (L slots, or 2 alternating slots when the saved inputs go to the host), `saved` the
  // host copies of blocks 0..L-2's outputs (the inputs of blocks 1..L-1); BTC floats per block.
  bool saved_inputs_on_host() const { return checkpointing_ && cpu_checkpointing_; }
  float* block_output(Buffer& outputs, int l, size_t BTC) const {
    return outputs.as<float>() + (saved_inputs_on_host() ? l % 2 : l) * BTC;
  }
  // After block l's forward: its output goes to the host (the last block's is read on the device
  // by the final norm, forward and backward, and never becomes a block input).
  void save_block_output(Buffer& outputs, Buffer& saved, int l, int L, size_t BTC) const;
  // Before block l's recomputation in backward: its input (block l-1's output) back on the device.
  void restore_block_input(Buffer& outputs, const Buffer& saved, int l, size_t BTC) const;

  DType dtype_;
  std::vector<FlatParam> units_;
  UnitHooks default_hooks_;
  UnitHooks* hooks_ = &default_hooks_;
  bool checkpointing_ = false;
  bool cpu_checkpointing_ = false;
};

// Builds the model a spec names: a GPT-2 preset or "gpt2:..." (gpt2.h), a LLaMA preset or
// "llama:..." (llama.h). Without `allocate` the units hold no storage (the engine materializes them;
// the estimator needs only the shapes). Throws Error naming the bad part of the spec.
std::unique_ptr<Model> make_model(const std::string& spec, DType compute_dtype, size_t align_numel = 64,
                                  bool allocate = true);

}  // namespace zerone::nn
