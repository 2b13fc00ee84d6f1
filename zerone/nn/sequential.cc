#include "zerone/nn/sequential.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "zerone/core/error.h"
#include "zerone/core/rng.h"

namespace zerone::nn {

namespace {

constexpr const char* kPrefix = "seq:";

const char* preset_spec(const std::string& name) {
  if (name == "mnist-mlp") return "seq:in=1x28x28,flatten,linear=256,relu,linear=10";
  if (name == "mnist-cnn")
    return "seq:in=1x28x28,conv=10:k5,maxpool=2,relu,conv=20:k5,maxpool=2,relu,flatten,linear=50,relu,linear=10";
  if (name == "cifar-cnn")
    return "seq:in=3x32x32,conv=64:k3:p1,relu,maxpool=2,conv=128:k3:p1,relu,maxpool=2,conv=256:k3:p1,relu,"
           "maxpool=2,flatten,linear=1024,relu,linear=10";
  return nullptr;
}

// A positive decimal integer of at most `limit`, or Error naming the spec and item.
int positive(const std::string& text, const std::string& spec, const std::string& item, int limit, bool zero_ok = false) {
  bool digits = !text.empty() && text.size() <= 9 && (text == "0" || text[0] != '0') &&
                std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  long long v = digits ? std::stoll(text) : -1;
  ZERONE_CHECK(digits && v >= (zero_ok ? 0 : 1) && v <= limit, "--model '", spec, "': '", item, "': '", text,
               "' is not a ", zero_ok ? "non-negative" : "positive", " decimal integer of at most ", limit);
  return static_cast<int>(v);
}

// "5" -> (5, 5); "3x5" -> (3, 5).
std::pair<int, int> pair_of(const std::string& text, const std::string& spec, const std::string& item, bool zero_ok) {
  auto x = text.find('x');
  if (x == std::string::npos) {
    int v = positive(text, spec, item, 4096, zero_ok);
    return {v, v};
  }
  return {positive(text.substr(0, x), spec, item, 4096, zero_ok), positive(text.substr(x + 1), spec, item, 4096, zero_ok)};
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == sep) out.push_back(std::exchange(cur, ""));
    else cur += c;
  }
  out.push_back(cur);
  return out;
}

std::string pair_text(int a, int b) { return a == b ? str_cat(a) : str_cat(a, "x", b); }

size_t product(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), size_t{1}, [](size_t a, int64_t b) { return a * b; });
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += str_cat(s.empty() ? "" : "x", d);
  return s;
}

// Output shape of `l` on `in`, or Error naming the spec and the layer.
std::vector<int64_t> output_shape(const LayerSpec& l, const std::vector<int64_t>& in, const std::string& spec, size_t i) {
  using Kind = LayerSpec::Kind;
  const std::string where = str_cat("--model '", spec, "': layer ", i + 1);
  switch (l.kind) {
    case Kind::relu:
    case Kind::dropout: return in;
    case Kind::flatten: return {static_cast<int64_t>(product(in))};
    case Kind::linear:
      ZERONE_CHECK(in.size() == 1, where, " (linear) gets a ", shape_text(in),
                   " input; a linear layer needs a flat one (add 'flatten' before it)");
      return {l.out};
    case Kind::conv2d:
    case Kind::maxpool2d: {
      const char* name = l.kind == Kind::conv2d ? "conv" : "maxpool";
      ZERONE_CHECK(in.size() == 3, where, " (", name, ") gets a ", shape_text(in), " input; it needs C x H x W");
      ZERONE_CHECK(l.pad_h * 2 <= l.kh && l.pad_w * 2 <= l.kw, where, " (", name, "): padding ",
                   pair_text(l.pad_h, l.pad_w), " is more than half the kernel ", pair_text(l.kh, l.kw));
      const int64_t oh = (in[1] + 2 * l.pad_h - l.kh) / l.stride_h + 1, ow = (in[2] + 2 * l.pad_w - l.kw) / l.stride_w + 1;
      ZERONE_CHECK(in[1] + 2 * l.pad_h >= l.kh && in[2] + 2 * l.pad_w >= l.kw && oh >= 1 && ow >= 1, where, " (", name,
                   "): kernel ", pair_text(l.kh, l.kw), " does not fit the ", shape_text(in), " input with padding ",
                   pair_text(l.pad_h, l.pad_w));
      return {l.kind == Kind::conv2d ? l.out : in[0], oh, ow};
    }
  }
  ZERONE_ASSERT(false);
}

}  // namespace

bool is_sequential_spec(const std::string& spec) {
  return preset_spec(spec) != nullptr || spec.rfind(kPrefix, 0) == 0;
}

std::string SequentialConfig::to_string() const {
  std::string s = str_cat(kPrefix, "in=", shape_text(input));
  using Kind = LayerSpec::Kind;
  for (const LayerSpec& l : layers) {
    s += ",";
    switch (l.kind) {
      case Kind::relu: s += "relu"; break;
      case Kind::flatten: s += "flatten"; break;
      case Kind::linear: s += str_cat("linear=", l.out); break;
      case Kind::dropout: {
        std::ostringstream p;
        p << l.p;
        s += "dropout=" + p.str();
        break;
      }
      case Kind::conv2d:
      case Kind::maxpool2d: {
        const bool conv = l.kind == Kind::conv2d;
        s += conv ? str_cat("conv=", l.out, ":k", pair_text(l.kh, l.kw)) : str_cat("maxpool=", pair_text(l.kh, l.kw));
        const bool default_stride = conv ? (l.stride_h == 1 && l.stride_w == 1) : (l.stride_h == l.kh && l.stride_w == l.kw);
        if (!default_stride) s += ":s" + pair_text(l.stride_h, l.stride_w);
        if (l.pad_h != 0 || l.pad_w != 0) s += ":p" + pair_text(l.pad_h, l.pad_w);
        break;
      }
    }
  }
  return s;
}

SequentialConfig parse_sequential_spec(const std::string& given) {
  const char* preset = preset_spec(given);
  const std::string spec = preset ? preset : given;
  ZERONE_CHECK(spec.rfind(kPrefix, 0) == 0, "--model '", given,
               "': expected a preset (mnist-mlp, mnist-cnn, cifar-cnn) or a spec such as "
               "seq:in=1x28x28,flatten,linear=256,relu,linear=10");
  const std::vector<std::string> items = split(spec.substr(std::strlen(kPrefix)), ',');
  SequentialConfig c;
  using Kind = LayerSpec::Kind;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string& item = items[i];
    ZERONE_CHECK(!item.empty(), "--model '", given, "': an empty item (two commas, or a trailing comma)");
    const auto eq = item.find('=');
    const std::string name = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (i == 0) {
      ZERONE_CHECK(name == "in" && !value.empty(), "--model '", given,
                   "': the first item must be the input shape, in=CxHxW (e.g. in=1x28x28) or in=F");
      for (const std::string& d : split(value, 'x')) c.input.push_back(positive(d, given, item, 1 << 24));
      ZERONE_CHECK(c.input.size() == 1 || c.input.size() == 3, "--model '", given, "': '", item,
                   "' has ", c.input.size(), " dimensions; expected CxHxW or F");
      continue;
    }
    ZERONE_CHECK(name != "in", "--model '", given, "': 'in=' may only come first");
    LayerSpec l;
    if (name == "relu" || name == "flatten") {
      ZERONE_CHECK(eq == std::string::npos, "--model '", given, "': '", item, "': ", name, " takes no value");
      l.kind = name == "relu" ? Kind::relu : Kind::flatten;
    } else if (name == "linear") {
      l.kind = Kind::linear;
      l.out = positive(value, given, item, 1 << 20);
    } else if (name == "dropout") {
      l.kind = Kind::dropout;
      char* end = nullptr;
      double p = value.empty() ? -1.0 : std::strtod(value.c_str(), &end);
      ZERONE_CHECK(!value.empty() && end && *end == '\0' && p >= 0.0 && p < 1.0, "--model '", given, "': '", item,
                   "': the dropout probability must be a number in [0, 1)");
      l.p = static_cast<float>(p);
    } else if (name == "conv" || name == "maxpool") {
      const bool conv = name == "conv";
      l.kind = conv ? Kind::conv2d : Kind::maxpool2d;
      std::vector<std::string> parts = split(value, ':');
      bool have_kernel = !conv, have_stride = false;
      if (conv) l.out = positive(parts[0], given, item, 1 << 16);
      else std::tie(l.kh, l.kw) = pair_of(parts[0], given, item, false);
      std::string seen;  // option letters so far: each may appear once (conv=4:k3:k5 took the last)
      for (size_t p = 1; p < parts.size(); ++p) {
        const std::string& opt = parts[p];
        ZERONE_CHECK(opt.size() >= 2 && (opt[0] == 's' || opt[0] == 'p' || (conv && opt[0] == 'k')), "--model '", given,
                     "': '", item, "': option '", opt, "' is not ", conv ? "kK, " : "", "sS or pP");
        ZERONE_CHECK(seen.find(opt[0]) == std::string::npos, "--model '", given, "': '", item, "': option '", opt[0],
                     "' is given twice: expected it once");
        seen += opt[0];
        auto v = pair_of(opt.substr(1), given, item, opt[0] == 'p');
        if (opt[0] == 'k') std::tie(l.kh, l.kw) = v, have_kernel = true;
        else if (opt[0] == 's') std::tie(l.stride_h, l.stride_w) = v, have_stride = true;
        else std::tie(l.pad_h, l.pad_w) = v;
      }
      ZERONE_CHECK(have_kernel, "--model '", given, "': '", item, "': a convolution needs its kernel size, e.g. conv=",
                   parts[0], ":k5");
      if (!conv && !have_stride) l.stride_h = l.kh, l.stride_w = l.kw;
    } else {
      ZERONE_CHECK(false, "--model '", given, "': unknown layer '", item,
                   "' (expected linear=N, relu, conv=OC:kK[:sS][:pP], maxpool=K[:sS][:pP], flatten, dropout=P)");
    }
    c.layers.push_back(l);
  }
  // The shapes must chain and end flat; at least one layer has parameters.
  std::vector<int64_t> shape = c.input;
  bool has_params = false;
  for (size_t i = 0; i < c.layers.size(); ++i) {
    shape = output_shape(c.layers[i], shape, given, i);
    has_params |= c.layers[i].kind == Kind::linear || c.layers[i].kind == Kind::conv2d;
  }
  ZERONE_CHECK(has_params, "--model '", given, "': no layer has parameters (add linear=N or conv=...)");
  ZERONE_CHECK(shape.size() == 1 && shape[0] >= 2, "--model '", given, "': the last layer's output is ",
               shape_text(shape), "; a classifier needs a flat output of at least 2 classes (end with linear=CLASSES)");
  return c;
}

Sequential::Sequential(const SequentialConfig& config, DType compute_dtype, size_t align_numel, bool allocate,
                       bool blocked_activations)
    : UnitModel(compute_dtype), config_(config) {
  using Kind = LayerSpec::Kind;
  std::vector<int64_t> shape = config.input;
  const std::string spec = config.to_string();
  // Note [Conv layouts] (kernels/cpu/conv.cc): convolutions output blocked (where the backend has a
  // blocked layout); pooling and ReLU keep their input's layout; flatten and dropout convert a
  // blocked input to plain.
  const bool can_block = blocked_activations && backend_.activation_channel_block() > 0;
  bool blocked = false;  // the layout of the next layer's input (the model's input is plain)
  for (size_t i = 0; i < config.layers.size(); ++i) {
    Layer l;
    l.spec = config.layers[i];
    l.in_shape = shape;
    l.out_shape = shape = output_shape(l.spec, shape, spec, i);
    l.in_numel = product(l.in_shape);
    l.out_numel = product(l.out_shape);
    l.in_blocked = blocked;
    switch (l.spec.kind) {
      case Kind::conv2d: l.out_blocked = can_block; break;
      case Kind::maxpool2d:
      case Kind::relu: l.out_blocked = blocked; break;
      case Kind::flatten:
      case Kind::dropout:
      case Kind::linear: l.convert_in = blocked; break;
    }
    blocked = l.out_blocked;
    l.out_stored = l.out_blocked ? backend_.activation_numel(static_cast<int>(l.out_shape[0]), static_cast<int>(l.out_shape[1]),
                                                       static_cast<int>(l.out_shape[2]), kernels::ActLayout::blocked)
                                 : l.out_numel;
    ZERONE_ASSERT(!(l.convert_in && l.spec.kind == Kind::linear), "a linear layer after a blocked activation");
    l.aliases_input = l.spec.kind == Kind::flatten && !l.convert_in;
    if (l.spec.kind == Kind::linear || l.spec.kind == Kind::conv2d) {
      l.unit = static_cast<int>(units_.size());
      std::vector<int64_t> wshape = l.spec.kind == Kind::linear
                                        ? std::vector<int64_t>{l.spec.out, l.in_shape[0]}
                                        : std::vector<int64_t>{l.spec.out, l.in_shape[0], l.spec.kh, l.spec.kw};
      units_.emplace_back(str_cat("layer.", i),
                          std::vector<TensorSpec>{{"weight", wshape, true}, {"bias", {l.spec.out}, true}}, dtype_,
                          align_numel, allocate);
    }
    layers_.push_back(std::move(l));
  }
  classes_ = static_cast<int>(shape[0]);
}

size_t Sequential::num_parameters() const {
  size_t n = 0;
  for (const FlatParam& u : units_) n += u.numel();
  return n;
}

void Sequential::init_unit(int u, uint64_t seed) {
  FlatParam& unit = units_[u];
  ZERONE_ASSERT(unit.has_params(), "init_unit on a unit without storage");
  const TensorSpec& w = unit.tensors()[0];
  const size_t fan_in = w.numel() / static_cast<size_t>(w.shape[0]);
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));  // PyTorch's Linear / Conv2d defaults
  std::vector<float> values;
  for (size_t t = 0; t < unit.tensors().size(); ++t) {
    values.resize(unit.tensors()[t].numel());
    fill_symmetric_uniform(values.data(), values.size(), seed, static_cast<uint64_t>(u) * 64 + t, bound);
    convert_from_f32(values.data(), unit.param(t), dtype_, values.size());
  }
}

kernels::Conv2dShape Sequential::conv_shape(const Layer& l, int B) const {
  using L = kernels::ActLayout;
  return {B,
          static_cast<int>(l.in_shape[0]),
          static_cast<int>(l.in_shape[1]),
          static_cast<int>(l.in_shape[2]),
          l.spec.out,
          l.spec.kh,
          l.spec.kw,
          l.spec.stride_h,
          l.spec.stride_w,
          l.spec.pad_h,
          l.spec.pad_w,
          l.in_blocked ? L::blocked : L::plain,
          l.out_blocked ? L::blocked : L::plain};
}

kernels::Pool2dShape Sequential::pool_shape(const Layer& l, int B) const {
  ZERONE_ASSERT(l.in_blocked == l.out_blocked);
  return {B,         static_cast<int>(l.in_shape[0]), static_cast<int>(l.in_shape[1]), static_cast<int>(l.in_shape[2]),
          l.spec.kh, l.spec.kw,    l.spec.stride_h, l.spec.stride_w, l.spec.pad_h, l.spec.pad_w,
          l.out_blocked ? kernels::ActLayout::blocked : kernels::ActLayout::plain};
}

size_t Sequential::Plan::total() const {
  size_t t = input_bytes + 2 * grad_bytes + head_bytes + weight_bytes;
  for (size_t b : out_bytes) t += b;
  for (size_t b : in_bytes) t += b;
  for (size_t b : workspace_bytes) t += b;
  return t;
}

// Note [Sequential activations]: forward keeps the input copy and every layer's output (flatten
// aliases its input; dropout outside training too, but its buffer is kept for training batches),
// max pooling's argmax workspace, and the head's probabilities, losses and labels; backward runs
// the gradient through two ping-pong buffers of the largest layer and, for non-f32 parameters,
// widens conv weights into one f32 buffer. Blocked activations (and their gradients) take their
// padded size; dropout after a blocked layer keeps a plain copy of its input. All of it scales
// with B, so one table serves the buffers and activation_bytes().
Sequential::Plan Sequential::plan(int B) const {
  Plan p;
  const size_t b = static_cast<size_t>(B);
  p.input_bytes = b * product(config_.input) * sizeof(float);
  size_t widest = product(config_.input), weight_numel = 0;
  for (const Layer& l : layers_) {
    p.out_bytes.push_back(l.aliases_input ? 0 : b * l.out_stored * sizeof(float));
    p.in_bytes.push_back(l.convert_in && l.spec.kind == LayerSpec::Kind::dropout ? b * l.in_numel * sizeof(float) : 0);
    p.workspace_bytes.push_back(l.spec.kind == LayerSpec::Kind::maxpool2d ? backend_.maxpool2d_workspace_bytes(pool_shape(l, B)) : 0);
    widest = std::max(widest, l.out_stored);
    if (l.spec.kind == LayerSpec::Kind::conv2d && dtype_ != DType::f32)
      weight_numel = std::max(weight_numel, units_[l.unit].tensors()[0].numel() + units_[l.unit].tensors()[1].numel());
  }
  p.grad_bytes = b * widest * sizeof(float);
  p.head_bytes = b * classes_ * sizeof(float) + 2 * b * sizeof(float);  // probs, losses, labels
  p.weight_bytes = weight_numel * sizeof(float);
  return p;
}

size_t Sequential::activation_bytes(int B, int T) const {
  ZERONE_CHECK(B >= 1 && B <= (1 << 24), "micro-batch ", B, " is out of range for ", spec());
  (void)T;  // one sample per row: T is 1
  return plan(B).total();
}

void Sequential::ensure_buffers(int B) {
  if (B <= capacity_) return;
  const Plan p = plan(B);
  auto make = [](size_t bytes) { return bytes ? Buffer(bytes, MemCategory::activation) : Buffer(); };
  input_ = make(p.input_bytes);
  outs_.clear();
  workspaces_.clear();
  ins_.clear();
  for (size_t i = 0; i < layers_.size(); ++i) {
    outs_.push_back(make(p.out_bytes[i]));
    ins_.push_back(make(p.in_bytes[i]));
    workspaces_.push_back(make(p.workspace_bytes[i]));
  }
  grad_a_ = make(p.grad_bytes);
  grad_b_ = make(p.grad_bytes);
  probs_ = make(static_cast<size_t>(B) * classes_ * sizeof(float));
  losses_ = make(static_cast<size_t>(B) * sizeof(float));
  labels_ = make(static_cast<size_t>(B) * sizeof(int32_t));
  weight_f32_ = make(p.weight_bytes);
  capacity_ = B;
}

kernels::DropoutKey Sequential::dropout_key(size_t layer) const {
  // Note [Dropout keys] (kernels/types.h): layer and step name the stream.
  return {dropout_seed_, mix64(static_cast<uint64_t>(layer) * 0x9e3779b97f4a7c15ull ^ mix64(dropout_step_)),
          dropout_first_sample_};
}

const float* Sequential::layer_input(size_t i) const { return i == 0 ? input_.as<float>() : out_ptr_[i - 1]; }

const float* Sequential::conv_weight(const Layer& l) {
  if (dtype_ == DType::f32) return static_cast<const float*>(p(l.unit, 0));
  const size_t n = units_[l.unit].tensors()[0].numel();
  backend_.convert(weight_f32_.data(), DType::f32, p(l.unit, 0), dtype_, n);
  return weight_f32_.as<float>();
}

float Sequential::forward(const int32_t*, const int32_t*, int, int) {
  ZERONE_ASSERT(false, "model ", spec(), " reads feature batches, not tokens");
}

float Sequential::forward(const Batch& batch) {
  using Kind = LayerSpec::Kind;
  ZERONE_ASSERT(batch.features != nullptr && batch.size >= 1, "model ", spec(), " needs a batch of features");
  const int B = batch.size;
  ensure_buffers(B);
  batch_ = B;
  training_ = batch.training;
  dropout_seed_ = batch.seed;
  dropout_step_ = batch.step;
  dropout_first_sample_ = batch.first_sample;
  backend_.copy_to_device(input_.data(), batch.features, static_cast<size_t>(B) * product(config_.input) * sizeof(float));
  out_ptr_.assign(layers_.size(), nullptr);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    const float* x = layer_input(i);
    float* y = outs_[i].as<float>();
    const size_t n = static_cast<size_t>(B) * l.out_stored;
    const int C = l.in_shape.size() == 3 ? static_cast<int>(l.in_shape[0]) : 0;
    const int H = C ? static_cast<int>(l.in_shape[1]) : 0, W = C ? static_cast<int>(l.in_shape[2]) : 0;
    switch (l.spec.kind) {
      case Kind::flatten:
        if (l.convert_in) backend_.activation_to_plain(y, x, B, C, H, W);
        else y = const_cast<float*>(x);
        break;
      case Kind::relu: backend_.relu_forward(y, x, n); break;
      case Kind::dropout:
        if (l.convert_in) {
          backend_.activation_to_plain(ins_[i].as<float>(), x, B, C, H, W);
          x = ins_[i].as<float>();
        }
        if (training_ && l.spec.p > 0.0f) {
          backend_.dropout_forward(y, x, B, l.out_numel, l.spec.p, dropout_key(i));
        } else {
          y = const_cast<float*>(x);
        }
        break;
      case Kind::maxpool2d: backend_.maxpool2d_forward(y, workspaces_[i].data(), x, pool_shape(l, B)); break;
      case Kind::linear:
      case Kind::conv2d:
        hooks_->before_forward(l.unit);
        if (l.spec.kind == Kind::linear)
          backend_.linear_forward(y, DType::f32, x, DType::f32, p(l.unit, 0), p(l.unit, 1), dtype_, B, static_cast<int>(l.in_numel),
                                  l.spec.out);
        else if (dtype_ == DType::f32)
          backend_.conv2d_forward(y, x, conv_weight(l), static_cast<const float*>(p(l.unit, 1)), conv_shape(l, B));
        else {
          // Widen weight and bias (adjacent in the unit) together.
          const size_t wn = units_[l.unit].tensors()[0].numel();
          backend_.convert(weight_f32_.data(), DType::f32, p(l.unit, 0), dtype_, wn + l.spec.out);
          backend_.conv2d_forward(y, x, weight_f32_.as<float>(), weight_f32_.as<float>() + wn, conv_shape(l, B));
        }
        hooks_->after_forward(l.unit);
        break;
    }
    out_ptr_[i] = y;
  }
  has_targets_ = batch.targets != nullptr;
  if (!has_targets_) return 0.0f;
  backend_.copy_to_device(labels_.data(), batch.targets, static_cast<size_t>(B) * sizeof(int32_t));
  for (int b = 0; b < B; ++b)
    ZERONE_ASSERT(batch.targets[b] >= 0 && batch.targets[b] < classes_, "label ", batch.targets[b], " of sample ", b,
                  " is outside 0..", classes_ - 1, " (the batch source validates labels)");
  return backend_.softmax_cross_entropy_forward(probs_.as<float>(), losses_.as<float>(), out_ptr_.back(), labels_.as<int32_t>(),
                                          B, classes_);
}

const void* Sequential::logits() const { return out_ptr_.empty() ? nullptr : out_ptr_.back(); }

void Sequential::backward(float grad_scale) {
  using Kind = LayerSpec::Kind;
  ZERONE_ASSERT(has_targets_, "backward without a forward with targets");
  const int B = batch_;
  float* dout = grad_a_.as<float>();
  float* spare = grad_b_.as<float>();
  backend_.softmax_cross_entropy_backward(dout, probs_.as<float>(), labels_.as<int32_t>(), B, classes_, grad_scale);
  for (size_t i = layers_.size(); i-- > 0;) {
    const Layer& l = layers_[i];
    const float* x = layer_input(i);
    const bool first = i == 0;  // the input needs no gradient
    const size_t n = static_cast<size_t>(B) * l.out_stored;
    switch (l.spec.kind) {
      case Kind::flatten: break;
      case Kind::relu: backend_.relu_backward(dout, dout, out_ptr_[i], n); break;
      case Kind::dropout:
        if (training_ && l.spec.p > 0.0f) backend_.dropout_backward(dout, dout, B, l.out_numel, l.spec.p, dropout_key(i));
        break;
      case Kind::maxpool2d:
        backend_.maxpool2d_backward(spare, dout, workspaces_[i].data(), pool_shape(l, B));
        std::swap(dout, spare);
        break;
      case Kind::linear:
      case Kind::conv2d: {
        hooks_->before_backward(l.unit);
        const bool accumulate = accumulate_grads(l.unit, {0, 1});
        if (l.spec.kind == Kind::linear) {
          backend_.linear_backward(first ? nullptr : spare, g(l.unit, 0), g(l.unit, 1), dout, DType::f32, x, DType::f32,
                                   p(l.unit, 0), dtype_, B, static_cast<int>(l.in_numel), l.spec.out, accumulate);
        } else {
          backend_.conv2d_backward(first ? nullptr : spare, g(l.unit, 0), g(l.unit, 1), dout, x, conv_weight(l),
                             conv_shape(l, B), accumulate);
        }
        hooks_->after_backward(l.unit);
        std::swap(dout, spare);
        break;
      }
    }
    if (l.convert_in && !first) {  // the plain gradient of a blocked input
      backend_.activation_to_blocked(spare, dout, B, static_cast<int>(l.in_shape[0]), static_cast<int>(l.in_shape[1]),
                               static_cast<int>(l.in_shape[2]));
      std::swap(dout, spare);
    }
  }
}

// forward() and backward()'s calls: the linear layers' (activations and their gradients in f32)
// and the classifier's. The convolutions and poolings keep no scratch of the backend's.
void Sequential::count_scratch(kernels::ScratchCount& count, int B, int /*T: one sample per row*/) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    if (l.spec.kind != LayerSpec::Kind::linear) continue;
    const int in = static_cast<int>(l.in_numel);
    count.linear_forward(DType::f32, DType::f32, true, dtype_, B, in, l.spec.out);
    count.linear_backward(/*dinp: the first layer's input needs none*/ i > 0, true, DType::f32, DType::f32, dtype_, B, in,
                          l.spec.out);
  }
  count.classifier_forward(B);
}

void Sequential::set_activation_checkpointing(bool on) {
  ZERONE_CHECK(!on, "--activation-checkpointing applies to the transformer models; ", spec(),
               " has no blocks to recompute");
}

}  // namespace zerone::nn
