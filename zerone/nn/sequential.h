// Sequential image classifiers: a stack of Linear, ReLU, Conv2d, MaxPool2d, Flatten and Dropout
// layers ending in softmax cross-entropy over classes (the seed examples of issue 11), as a Model
// (model.h) the ZeRO engine and trainer drive like the transformers.
//
// Spec string (`--model`): "seq:in=CxHxW,<layer>,<layer>,..." (or "in=F" for flat inputs) with
//   linear=OUT               fully connected, weight (OUT, IN) and bias (OUT); needs a flat input
//   conv=OC:kK[:sS][:pP]     2-D convolution (oneDNN), weight (OC, C, K, K), bias (OC); kKHxKW,
//                            sSHxSW, pPHxPW give rectangular kernels, strides, padding
//   maxpool=K[:sS][:pP]      max pooling (oneDNN); stride defaults to K, as torch.nn.MaxPool2d
//   relu | flatten | dropout=P
// The number of classes is the last layer's output size (which must be flat). Presets:
//   mnist-mlp  seq:in=1x28x28,flatten,linear=256,relu,linear=10                   (784-256-10)
//   mnist-cnn  PyTorch's classic SimpleCNN: conv 1->10 k5, pool 2, relu, conv 10->20 k5, pool 2,
//              relu, flatten, linear 320->50, relu, linear 50->10
//   cifar-cnn  in 3x32x32: conv 3->64->128->256 k3 p1, each with relu and pool 2, linear
//              4096->1024, relu, linear 1024->10
//
// Units: each layer with parameters (linear, conv) is one unit ("layer.<i>": weight, bias), so
// ZeRO gathers, reduces and shards per layer. Every tensor is weight-decayed, as a PyTorch
// optimizer given model.parameters() does. Initialization follows PyTorch's defaults for Linear
// and Conv2d: weight and bias uniform in +-1/sqrt(fan_in), from (seed, unit, tensor, element).
//
// Precision: parameters live in the compute dtype. Linear layers run their GEMMs in it (ops.h);
// convolutions widen the weights to f32 and run in f32. Activations and gradients are f32.
// Activation checkpointing does not apply (no blocks to recompute) and is refused.
// Layout: the outputs of conv layers, and of the max-pool and ReLU layers that follow them, are
// held in oneDNN's channel-blocked layout (Note [Conv layouts] in kernels/cpu/conv.cc) unless the
// constructor is told otherwise; flatten and dropout convert to plain NCHW. The layout changes no
// value (tests/nn/sequential_test.cc holds both to the same bits).
//
// Thread-safety: one thread drives a model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zerone/core/memory.h"
#include "zerone/kernels/types.h"
#include "zerone/nn/model.h"

namespace zerone::nn {

struct LayerSpec {
  enum class Kind { linear, relu, conv2d, maxpool2d, flatten, dropout };
  Kind kind = Kind::relu;
  int out = 0;  // linear: output features; conv2d: output channels
  int kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;  // conv2d, maxpool2d
  float p = 0.0f;  // dropout probability
  bool operator==(const LayerSpec&) const = default;
};

struct SequentialConfig {
  std::vector<int64_t> input;  // one sample's shape: {C, H, W} or {F}
  std::vector<LayerSpec> layers;
  // The canonical spec ("seq:in=1x28x28,..."), parsed back to the same config.
  std::string to_string() const;
  bool operator==(const SequentialConfig&) const = default;
};

// A preset name or a "seq:" spec.
bool is_sequential_spec(const std::string& spec);
// Parses a preset or a "seq:" spec and checks that the shapes chain (every layer has a non-empty
// output, linear layers get flat inputs, the last output is flat). Throws Error naming the spec,
// the layer and what was expected.
SequentialConfig parse_sequential_spec(const std::string& spec);

class Sequential final : public UnitModel {
 public:
  // blocked_activations false holds every activation plain (NCHW), for comparison.
  Sequential(const SequentialConfig& config, DType compute_dtype, size_t align_numel = 64, bool allocate = true,
             bool blocked_activations = true);
  const SequentialConfig& config() const { return config_; }

  std::string spec() const override { return config_.to_string(); }
  size_t num_parameters() const override;
  int vocab_size() const override { return classes_; }
  int max_seq_len() const override { return 1; }
  InputKind input_kind() const override { return InputKind::features; }
  std::vector<int64_t> input_shape() const override { return config_.input; }
  std::vector<int> units_touched(int u) const override { return {u}; }
  void init_unit(int unit, uint64_t seed) override;

  // features (B, prod(input)) f32; targets (B) labels in [0, classes). Returns the mean
  // cross-entropy (0 without targets). Dropout is active only when batch.training.
  float forward(const Batch& batch) override;
  // Token batches do not apply: aborts (the trainer checks input_kind() first).
  float forward(const int32_t* inputs, const int32_t* targets, int B, int T) override;
  void backward(float grad_scale) override;
  const void* logits() const override;
  int logits_stride() const override { return classes_; }
  void set_activation_checkpointing(bool on) override;
  void set_cpu_checkpointing(bool on) override { Model::set_cpu_checkpointing(on); }  // refuses: no blocks
  size_t activation_bytes(int B, int T) const override;

 protected:
  void count_scratch(kernels::ScratchCount& count, int B, int T) const override;

 private:
  struct Layer {
    LayerSpec spec;
    int unit = -1;                          // linear, conv2d: the unit of its parameters
    std::vector<int64_t> in_shape, out_shape;
    size_t in_numel = 0, out_numel = 0;     // per sample
    size_t out_stored = 0;                  // floats per sample of the output as held (blocked: padded)
    bool in_blocked = false, out_blocked = false;  // the layouts of its input and output
    bool convert_in = false;                // flatten, dropout: a blocked input converted to plain first
    bool aliases_input = false;             // flatten (plain input), dropout (when not training)
  };
  kernels::Conv2dShape conv_shape(const Layer& l, int B) const;
  kernels::Pool2dShape pool_shape(const Layer& l, int B) const;
  // Sizes every buffer for B samples (reallocating when B grows); the table activation_bytes uses.
  struct Plan {
    std::vector<size_t> out_bytes, workspace_bytes;  // per layer; 0 when nothing is stored
    std::vector<size_t> in_bytes;                    // per layer: dropout's plain copy of a blocked input
    size_t input_bytes = 0, grad_bytes = 0, head_bytes = 0, weight_bytes = 0;
    size_t total() const;
  };
  Plan plan(int B) const;
  void ensure_buffers(int B);
  // f32 view of a conv layer's weight: the parameters themselves for f32, else widened to scratch.
  const float* conv_weight(const Layer& l);
  const float* layer_input(size_t i) const;
  kernels::DropoutKey dropout_key(size_t layer) const;

  SequentialConfig config_;
  std::vector<Layer> layers_;
  int classes_ = 0;
  // Activations of the last forward.
  int capacity_ = 0;  // samples the buffers hold
  Buffer input_;      // (B, prod(input))
  std::vector<Buffer> outs_, workspaces_, ins_;
  Buffer grad_a_, grad_b_, probs_, losses_, labels_, weight_f32_;
  std::vector<const float*> out_ptr_;  // per layer: its output (an alias for flatten / eval dropout)
  int batch_ = 0;
  bool has_targets_ = false, training_ = false;
  uint64_t dropout_seed_ = 0, dropout_step_ = 0, dropout_first_sample_ = 0;  // of the last forward
};

}  // namespace zerone::nn
