#include "zerone/io/hf_checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "zerone/core/error.h"
#include "zerone/io/file.h"
#include "zerone/io/safetensors.h"
#include "zerone/nn/gpt2.h"
#include "zerone/nn/llama.h"

namespace zerone::io {
namespace {

using json = nlohmann::json;

// One Hugging Face tensor as a row range of a zerone tensor (Note [Hugging Face tensor map]).
struct HfSlice {
  int unit = 0, tensor = 0;       // the zerone tensor
  std::string name;               // the Hugging Face tensor
  int64_t row_begin = 0, rows = 0;  // the zerone rows it covers
  int64_t cols = 1;               // zerone row width (1 for vectors)
  bool transposed = false;        // stored (cols, rows): Conv1D
  std::vector<int64_t> hf_shape() const {
    if (cols == 1) return {rows};
    return transposed ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols};
  }
  uint64_t numel() const { return static_cast<uint64_t>(rows) * cols; }
};

int64_t cols_of(const nn::TensorSpec& t) { return t.shape.size() == 2 ? t.shape[1] : 1; }

std::vector<HfSlice> hf_map(const nn::Model& model) {
  std::vector<HfSlice> out;
  auto whole = [&](int u, int t, const std::string& name, bool transposed = false) {
    const nn::TensorSpec& spec = model.units()[u].tensors()[t];
    out.push_back(HfSlice{u, t, name, 0, spec.shape[0], cols_of(spec), transposed});
  };
  auto rows = [&](int u, int t, const std::string& name, int64_t begin, int64_t count) {
    const nn::TensorSpec& spec = model.units()[u].tensors()[t];
    out.push_back(HfSlice{u, t, name, begin, count, cols_of(spec), false});
  };
  if (const auto* g = dynamic_cast<const nn::GPT2*>(&model)) {
    const nn::GPT2Config& c = g->config();
    rows(0, nn::kWte, "transformer.wte.weight", 0, c.vocab_size);
    whole(0, nn::kWpe, "transformer.wpe.weight");
    for (int l = 0; l < c.num_layers; ++l) {
      const int u = 1 + l;
      const std::string p = str_cat("transformer.h.", l, ".");
      whole(u, nn::kLn1w, p + "ln_1.weight");
      whole(u, nn::kLn1b, p + "ln_1.bias");
      whole(u, nn::kQkvw, p + "attn.c_attn.weight", true);
      whole(u, nn::kQkvb, p + "attn.c_attn.bias");
      whole(u, nn::kAttprojw, p + "attn.c_proj.weight", true);
      whole(u, nn::kAttprojb, p + "attn.c_proj.bias");
      whole(u, nn::kLn2w, p + "ln_2.weight");
      whole(u, nn::kLn2b, p + "ln_2.bias");
      whole(u, nn::kFcw, p + "mlp.c_fc.weight", true);
      whole(u, nn::kFcb, p + "mlp.c_fc.bias");
      whole(u, nn::kFcprojw, p + "mlp.c_proj.weight", true);
      whole(u, nn::kFcprojb, p + "mlp.c_proj.bias");
    }
    whole(c.num_layers + 1, nn::kLnfw, "transformer.ln_f.weight");
    whole(c.num_layers + 1, nn::kLnfb, "transformer.ln_f.bias");
    return out;
  }
  const auto* m = dynamic_cast<const nn::Llama*>(&model);
  ZERONE_ASSERT(m != nullptr, "no Hugging Face tensor map for ", model.spec());
  const nn::LlamaConfig& c = m->config();
  const int64_t q = static_cast<int64_t>(c.num_heads) * c.head_dim, kv = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  whole(0, 0, "model.embed_tokens.weight");
  for (int l = 0; l < c.num_layers; ++l) {
    const int u = 1 + l;
    const std::string p = str_cat("model.layers.", l, ".");
    whole(u, nn::kAttnNorm, p + "input_layernorm.weight");
    rows(u, nn::kWqkv, p + "self_attn.q_proj.weight", 0, q);
    rows(u, nn::kWqkv, p + "self_attn.k_proj.weight", q, kv);
    rows(u, nn::kWqkv, p + "self_attn.v_proj.weight", q + kv, kv);
    whole(u, nn::kWo, p + "self_attn.o_proj.weight");
    whole(u, nn::kMlpNorm, p + "post_attention_layernorm.weight");
    rows(u, nn::kWGateUp, p + "mlp.gate_proj.weight", 0, c.ffn);
    rows(u, nn::kWGateUp, p + "mlp.up_proj.weight", c.ffn, c.ffn);
    whole(u, nn::kWDown, p + "mlp.down_proj.weight");
  }
  whole(c.num_layers + 1, nn::kNorm, "model.norm.weight");
  if (!c.tie_word_embeddings) whole(c.num_layers + 1, nn::kLmHead, "lm_head.weight");
  return out;
}

// Buffers some GPT-2 files carry that are not parameters.
bool ignorable(const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    size_t n = std::strlen(suffix);
    return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") || ends_with("rotary_emb.inv_freq");
}

json read_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  try {
    return json::parse(read_text_file(path, "--init", size_t{16} << 20));
  } catch (const json::exception& e) {
    throw Error(str_cat("'", path, "' is not valid JSON: ", e.what()));
  }
}

// The new model.safetensors replaces a sharded model the directory held: the index goes first (a
// reader then sees one layout), then the shards it names. Leftovers of a failure here make the
// directory hold both layouts, which readers refuse rather than read the stale one.
void remove_sharded_layout(const std::string& dir) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  struct stat st;
  if (::lstat(index_path.c_str(), &st) != 0) return;
  std::set<std::string> shards;
  try {
    const json index = json::parse(read_text_file(index_path, "", size_t{64} << 20));
    if (index.is_object() && index.contains("weight_map") && index["weight_map"].is_object())
      for (auto& [name, file] : index["weight_map"].items())
        if (file.is_string()) {
          const std::string f = file.get<std::string>();
          if (!f.empty() && f.find('/') == std::string::npos && f != "." && f != ".." && f != "model.safetensors")
            shards.insert(f);
        }
  } catch (const std::exception&) {
  }
  ZERONE_CHECK(::unlink(index_path.c_str()) == 0, "cannot remove the stale sharded index '", index_path, "': ",
               std::strerror(errno));
  for (const std::string& f : shards) ::unlink((dir + "/" + f).c_str());
}

}  // namespace

bool is_hf_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::stat((path + "/config.json").c_str(), &st) == 0;
}

std::string read_hf_spec(const std::string& dir, std::string* notice) {
  const std::string path = dir + "/config.json";
  json c = read_config(dir);
  ZERONE_CHECK(c.is_object(), "'", path, "' is not a JSON object");
  auto integer = [&](const char* key, std::optional<int64_t> fallback = std::nullopt) -> int64_t {
    if (!c.contains(key) || c[key].is_null()) {
      ZERONE_CHECK(fallback.has_value(), "'", path, "' lacks \"", key, "\"");
      return *fallback;
    }
    ZERONE_CHECK(c[key].is_number_integer() && c[key].get<int64_t>() > 0, "'", path, "': \"", key, "\" is ", c[key].dump(),
                 ", expected a positive integer");
    return c[key].get<int64_t>();
  };
  auto number = [&](const json& o, const char* key, double fallback) -> double {
    if (!o.contains(key) || o[key].is_null()) return fallback;
    ZERONE_CHECK(o[key].is_number() && !o[key].is_boolean(), "'", path, "': \"", key, "\" is ", o[key].dump(),
                 ", expected a number");
    return o[key].get<double>();
  };
  auto boolean = [&](const char* key, bool fallback) -> bool {
    if (!c.contains(key) || c[key].is_null()) return fallback;
    ZERONE_CHECK(c[key].is_boolean(), "'", path, "': \"", key, "\" is ", c[key].dump(), ", expected true or false");
    return c[key].get<bool>();
  };
  auto string = [&](const char* key, const std::string& fallback) -> std::string {
    if (!c.contains(key) || c[key].is_null()) return fallback;
    ZERONE_CHECK(c[key].is_string(), "'", path, "': \"", key, "\" is ", c[key].dump(), ", expected a string");
    return c[key].get<std::string>();
  };
  const std::string type = string("model_type", "");
  if (type == "gpt2") {
    const int64_t C = integer("n_embd"), inner = c.contains("n_inner") && !c["n_inner"].is_null() ? integer("n_inner") : 4 * C;
    ZERONE_CHECK(inner == 4 * C, "'", path, "': n_inner ", inner, " is not 4 x n_embd: zerone's GPT-2 has a 4x MLP");
    const std::string act = string("activation_function", "gelu_new");
    ZERONE_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", "'", path, "': activation_function '", act,
                 "' is not supported (expected gelu_new, GPT-2's tanh GELU)");
    ZERONE_CHECK(number(c, "layer_norm_epsilon", 1e-5) == 1e-5, "'", path, "': layer_norm_epsilon must be 1e-5");
    ZERONE_CHECK(boolean("tie_word_embeddings", true), "'", path, "': an untied GPT-2 head is not supported");
    // Keys that change the attention itself (transformers' GPT2Attention): refused, never ignored.
    ZERONE_CHECK(!boolean("scale_attn_by_inverse_layer_idx", false), "'", path,
                 "': \"scale_attn_by_inverse_layer_idx\": true (attention scores of layer l also divided by l + 1) ",
                 "is not supported: zerone's GPT-2 scales every layer's scores by 1/sqrt(head_dim) only");
    ZERONE_CHECK(boolean("scale_attn_weights", true), "'", path,
                 "': \"scale_attn_weights\": false (attention scores left unscaled) is not supported: zerone's GPT-2 ",
                 "scales them by 1/sqrt(head_dim)");
    return str_cat("gpt2:layers=", integer("n_layer"), ",dim=", C, ",heads=", integer("n_head"), ",vocab=",
                   integer("vocab_size"), ",ctx=", integer("n_positions"));
  }
  if (type == "llama" || type == "mistral") {
    ZERONE_CHECK(!boolean("attention_bias", false) && !boolean("mlp_bias", false), "'", path,
                 "': attention or MLP biases are not supported (LLaMA has none)");
    const std::string act = string("hidden_act", "silu");
    ZERONE_CHECK(act == "silu", "'", path, "': hidden_act '", act, "' is not supported (expected silu)");
    ZERONE_CHECK(!c.contains("sliding_window") || c["sliding_window"].is_null(), "'", path,
                 "': sliding-window attention is not supported");
    if (type == "mistral" && notice != nullptr)
      *notice = str_cat("'", path, "': model_type 'mistral' without a sliding window is read as LLaMA (the same ",
                        "architecture)");
    // Note [rope_parameters]: transformers 5 writes the rotary settings as one object,
    // "rope_parameters": {"rope_type": "default" | "llama3" | ..., "rope_theta": ..., "factor": ...},
    // where earlier versions wrote "rope_theta" and "rope_scaling" (null for none) at the top level.
    // Either is read, rope_parameters first (as transformers 5 does); a file holding both must agree
    // on theta. Ignoring rope_parameters would train a llama3-scaled model with theta 10000 and no
    // scaling, without a word.
    const json* rope = nullptr;
    std::string rope_key;
    double rope_theta = number(c, "rope_theta", 10000.0);
    if (c.contains("rope_parameters") && !c["rope_parameters"].is_null()) {
      rope = &c["rope_parameters"];
      rope_key = "rope_parameters";
      ZERONE_CHECK(rope->is_object(), "'", path, "': rope_parameters is not an object");
      const double theta = number(*rope, "rope_theta", rope_theta);
      ZERONE_CHECK(!c.contains("rope_theta") || c["rope_theta"].is_null() || theta == rope_theta, "'", path,
                   "': \"rope_theta\" ", rope_theta, " differs from rope_parameters' ", theta, ": expected one value");
      rope_theta = theta;
    } else if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
      rope = &c["rope_scaling"];
      rope_key = "rope_scaling";
    }
    const int64_t C = integer("hidden_size"), NH = integer("num_attention_heads");
    std::string spec = str_cat("llama:layers=", integer("num_hidden_layers"), ",dim=", C, ",heads=", NH, ",kv_heads=",
                               integer("num_key_value_heads", NH), ",head_dim=", integer("head_dim", C / NH), ",ffn=",
                               integer("intermediate_size"), ",vocab=", integer("vocab_size"), ",ctx=",
                               integer("max_position_embeddings", 2048), ",theta=", rope_theta,
                               ",eps=", number(c, "rms_norm_eps", 1e-6), ",tied=",
                               boolean("tie_word_embeddings", false) ? 1 : 0);
    if (rope != nullptr) {
      const json& r = *rope;
      ZERONE_CHECK(r.is_object(), "'", path, "': ", rope_key, " is not an object");
      const json& type_entry = r.contains("rope_type") ? r["rope_type"] : r.contains("type") ? r["type"] : json();
      ZERONE_CHECK(type_entry.is_string() || (type_entry.is_null() && rope_key == "rope_parameters"), "'", path, "': ",
                   rope_key, " has no string \"rope_type\" (expected llama3 or default)");
      const std::string rtype = type_entry.is_string() ? type_entry.get<std::string>() : "default";
      ZERONE_CHECK(rtype == "llama3" || rtype == "default", "'", path, "': ", rope_key, " type '", rtype,
                   "' is not supported (expected llama3)");
      if (rtype == "llama3")
        spec += str_cat(",rope_factor=", number(r, "factor", 8.0), ",rope_low=", number(r, "low_freq_factor", 1.0),
                        ",rope_high=", number(r, "high_freq_factor", 4.0), ",rope_orig=",
                        static_cast<int64_t>(number(r, "original_max_position_embeddings", 8192)));
    }
    return spec;
  }
  throw Error(str_cat("'", path, "': model_type '", type, "' is not supported (expected gpt2 or llama)"));
}

namespace {

bool tied_head_matches(const SafetensorsReader& reader, const std::vector<HfSlice>& map,
                       const std::vector<const SafetensorInfo*>& found, const SafetensorInfo& head, const std::string& dir) {
  // A tied model's head is its embedding; some files store it anyway (transformers saves it when
  // asked, and loads it tied). Taken when equal to the embedding, refused when it differs.
  const SafetensorInfo* embedding = nullptr;
  for (size_t i = 0; i < map.size(); ++i)
    if (map[i].name == "transformer.wte.weight" || map[i].name == "model.embed_tokens.weight") embedding = found[i];
  if (embedding == nullptr) return false;
  ZERONE_CHECK(head.shape == embedding->shape, "--init '", dir, "': tensor 'lm_head.weight' has shape ",
               json(head.shape).dump(), ", but the model ties its head to '", embedding->name, "' of shape ",
               json(embedding->shape).dump());
  const uint64_t n = embedding->numel(), chunk = uint64_t{1} << 20;
  std::vector<float> a, b;
  for (uint64_t begin = 0; begin < n; begin += chunk) {
    const uint64_t count = std::min(chunk, n - begin);
    a.resize(count);
    b.resize(count);
    reader.read_f32(head, begin, count, a.data());
    reader.read_f32(*embedding, begin, count, b.data());
    for (uint64_t k = 0; k < count; ++k)
      ZERONE_CHECK(a[k] == b[k], "--init '", dir, "': tensor 'lm_head.weight' differs from '", embedding->name,
                   "' (element ", begin + k, ": ", a[k], " vs ", b[k], "), but the model ties its head to the embedding ",
                   "(tie_word_embeddings): an untied head is not supported");
  }
  return true;
}

}  // namespace

struct HfCheckpointReader::Impl {
  std::string dir;
  SafetensorsReader reader;
  std::vector<HfSlice> map;
  std::vector<const SafetensorInfo*> found;  // map[i]'s tensor in the files
  Impl(const std::string& d, const nn::Model& model) : dir(d), reader(d), map(hf_map(model)) {}
};

HfCheckpointReader::HfCheckpointReader(const std::string& dir, const nn::Model& model)
    : impl_(std::make_unique<Impl>(dir, model)) {
  Impl& m = *impl_;
  // Resolve names (GPT2Model files lack "transformer.") and check the files hold exactly the model.
  std::set<std::string> used;
  for (const HfSlice& s : m.map) {
    const SafetensorInfo* t = m.reader.find(s.name);
    if (t == nullptr && s.name.rfind("transformer.", 0) == 0) t = m.reader.find(s.name.substr(12));
    ZERONE_CHECK(t != nullptr, "--init '", dir, "' lacks tensor '", s.name, "' of ", model.spec());
    ZERONE_CHECK(t->shape == s.hf_shape(), "--init '", dir, "': tensor '", t->name, "' has shape ",
                 json(t->shape).dump(), ", expected ", json(s.hf_shape()).dump(), " for ", model.spec());
    used.insert(t->name);
    m.found.push_back(t);
  }
  for (const SafetensorInfo& t : m.reader.tensors()) {
    if (t.name == "lm_head.weight" && !used.count(t.name) && tied_head_matches(m.reader, m.map, m.found, t, dir)) continue;
    ZERONE_CHECK(used.count(t.name) || ignorable(t.name), "--init '", dir, "' holds tensor '", t.name, "', which ",
                 model.spec(), " does not have (a checkpoint of another architecture?)");
  }
}


HfCheckpointReader::~HfCheckpointReader() = default;

void HfCheckpointReader::load_unit(nn::Model& model, int u) const {
  const Impl& m = *impl_;
  std::vector<float> hf, rows;
  for (size_t i = 0; i < m.map.size(); ++i) {
    const HfSlice& s = m.map[i];
    if (s.unit != u) continue;
    nn::FlatParam& unit = model.units()[s.unit];
    const nn::TensorSpec& spec = unit.tensors()[s.tensor];
    const SafetensorInfo* t = m.found[i];
    const size_t value_bytes = dtype_size(unit.dtype());
    char* tensor = static_cast<char*>(unit.param(s.tensor));
    char* dst = tensor + s.row_begin * s.cols * value_bytes;
    // Untransposed tensors (the embeddings, the largest) in chunks: a few MiB beside the unit.
    const size_t chunk = s.transposed ? s.numel() : std::min<size_t>(s.numel(), size_t{1} << 22);
    for (size_t b = 0; b < s.numel(); b += chunk) {
      const size_t n = std::min(chunk, s.numel() - b);
      hf.resize(n);
      m.reader.read_f32(*t, b, n, hf.data());
      for (size_t k = 0; k < n; ++k)
        ZERONE_CHECK(std::isfinite(hf[k]), "--init '", m.dir, "': tensor '", t->name,
                     "' holds a non-finite value at element ", b + k, ": the file is corrupt");
      const float* src = hf.data();
      if (s.transposed) {  // stored (cols, rows): zerone's row r, column c is hf[c][r]
        rows.resize(s.numel());
        for (int64_t r = 0; r < s.rows; ++r)
          for (int64_t col = 0; col < s.cols; ++col) rows[r * s.cols + col] = hf[col * s.rows + r];
        src = rows.data();
      }
      convert_from_f32(src, dst + b * value_bytes, unit.dtype(), n);
    }
    // Rows past the last Hugging Face slice of this tensor (GPT-2's padded vocabulary) are zero.
    const int64_t covered_end = s.row_begin + s.rows;
    const bool last_slice = i + 1 == m.map.size() || m.map[i + 1].unit != s.unit || m.map[i + 1].tensor != s.tensor;
    if (last_slice && covered_end < spec.shape[0])
      std::memset(tensor + covered_end * s.cols * value_bytes, 0, (spec.shape[0] - covered_end) * s.cols * value_bytes);
  }
}

void load_hf_checkpoint(const std::string& dir, nn::Model& model, int only_unit) {
  HfCheckpointReader reader(dir, model);
  for (int u = 0; u < model.num_units(); ++u)
    if (only_unit < 0 || u == only_unit) reader.load_unit(model, u);
}

void check_hf_output(const std::string& dir, const std::string& what) {
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  struct stat st;
  if (::lstat(trimmed.c_str(), &st) == 0) {
    ZERONE_CHECK(S_ISDIR(st.st_mode), what, ": '", dir, "' exists and is not a directory");
    for (const char* name : {"config.json", "model.safetensors", "generation_config.json"})
      check_atomic_output(trimmed + "/" + name, what);
    return;
  }
  const size_t slash = trimmed.rfind('/');
  const std::string parent = slash == std::string::npos ? "." : trimmed.substr(0, std::max<size_t>(slash, 1));
  ZERONE_CHECK(::stat(parent.c_str(), &st) == 0 && S_ISDIR(st.st_mode), what, ": directory '", parent, "' of '", dir,
               "' does not exist: create it first");
  ZERONE_CHECK(::access(parent.c_str(), W_OK | X_OK) == 0, what, ": directory '", parent, "' is not writable: ",
               std::strerror(errno));
}

const char* const kHfTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                         "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model"};
const size_t kNumHfTokenizerFiles = sizeof kHfTokenizerFiles / sizeof kHfTokenizerFiles[0];

namespace {

// The token id `key` of a source config (an integer, or the first of a list as some LLaMA-3 files
// write eos_token_id), or null.
json token_id(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return nullptr;
  const json& v = config[key];
  if (v.is_number_integer() || (v.is_array() && !v.empty() && v[0].is_number_integer())) return v;
  return nullptr;
}

// Copies `from` to `to` atomically, in chunks. Throws Error naming the file.
void copy_file_atomically(const std::string& from, const std::string& to) {
  size_t bytes = 0;
  FileDescriptor fd = open_regular_file(from, "", &bytes);
  std::vector<char> chunk(std::min<size_t>(bytes, size_t{1} << 22));
  write_file_atomically(to, [&](std::FILE* f) {
    for (size_t at = 0; at < bytes; at += chunk.size()) {
      const size_t n = std::min(chunk.size(), bytes - at);
      read_exactly(fd.get(), chunk.data(), n, at, from);
      write_all(f, chunk.data(), n, to);
    }
  });
}

}  // namespace

void save_hf_checkpoint(const std::string& dir_in, const nn::Model& model, const UnitLoader& load,
                        const HfSaveExtras& extras) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const bool created = ::mkdir(dir.c_str(), 0755) == 0;
  if (!created) ZERONE_CHECK(errno == EEXIST, "cannot create directory '", dir, "': ", std::strerror(errno));
  // A directory this call created goes again if the save fails (a damaged source, a full disk, an
  // interrupt): no empty or half-filled output is left. An existing one keeps its old files.
  struct RemoveUnlessDone {
    const std::string& dir;
    bool armed;
    ~RemoveUnlessDone() {
      if (!armed) return;
      for (const char* name : {"model.safetensors", "config.json", "generation_config.json"})
        ::unlink((dir + "/" + name).c_str());
      for (size_t i = 0; i < kNumHfTokenizerFiles; ++i) ::unlink((dir + "/" + kHfTokenizerFiles[i]).c_str());
      ::rmdir(dir.c_str());
    }
  } cleanup{dir, created};
  const DType dtype = model.compute_dtype();
  const char* torch_dtype = dtype == DType::f32 ? "float32" : dtype == DType::bf16 ? "bfloat16" : "float16";
  nlohmann::ordered_json config;
  if (const auto* g = dynamic_cast<const nn::GPT2*>(&model)) {
    const nn::GPT2Config& c = g->config();
    config = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", c.vocab_size},
              {"n_positions", c.max_seq_len}, {"n_ctx", c.max_seq_len}, {"n_embd", c.channels},
              {"n_layer", c.num_layers}, {"n_head", c.num_heads}, {"n_inner", nullptr},
              {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5}, {"tie_word_embeddings", true},
              {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0}, {"torch_dtype", torch_dtype}};
    if (c.vocab_size == 50257) config["bos_token_id"] = config["eos_token_id"] = 50256;
  } else {
    const nn::LlamaConfig& c = dynamic_cast<const nn::Llama&>(model).config();
    config = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", c.channels},
              {"intermediate_size", c.ffn}, {"num_hidden_layers", c.num_layers}, {"num_attention_heads", c.num_heads},
              {"num_key_value_heads", c.num_kv_heads}, {"head_dim", c.head_dim}, {"vocab_size", c.vocab_size},
              {"max_position_embeddings", c.max_seq_len}, {"rms_norm_eps", std::stod(str_cat(c.rms_norm_eps))},
              {"rope_theta", std::stod(str_cat(c.rope_theta))}, {"tie_word_embeddings", c.tie_word_embeddings}, {"hidden_act", "silu"},
              {"attention_bias", false}, {"mlp_bias", false}, {"torch_dtype", torch_dtype}};
    if (c.rope_scaling.factor > 0)
      config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", c.rope_scaling.factor},
                                {"low_freq_factor", c.rope_scaling.low_freq_factor},
                                {"high_freq_factor", c.rope_scaling.high_freq_factor},
                                {"original_max_position_embeddings", c.rope_scaling.original_max_position}};
    else
      config["rope_scaling"] = nullptr;
  }
  // Note [What an export carries]: the source's special token ids.
  const json source_config = extras.source_dir.empty() ? json() : read_config(extras.source_dir);
  for (const char* key : {"bos_token_id", "eos_token_id"})
    if (json id = token_id(source_config, key); !id.is_null()) config[key] = nlohmann::ordered_json::parse(id.dump());
  const std::vector<HfSlice> map = hf_map(model);
  SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  for (const HfSlice& s : map) writer.add(s.name, dtype, s.hf_shape());
  int loaded = -1;
  writer.write(dir + "/model.safetensors", [&](size_t i, void* out) {
    const HfSlice& s = map[i];
    if (load && s.unit != loaded) load(loaded = s.unit);
    const nn::FlatParam& unit = model.units()[s.unit];
    ZERONE_ASSERT(unit.has_params(), "save_hf_checkpoint needs full parameters (unit ", unit.name(), ")");
    ZERONE_ASSERT(unit.dtype() == dtype);
    const size_t esize = dtype_size(dtype);
    const char* rows = static_cast<const char*>(unit.param(s.tensor)) + s.row_begin * s.cols * esize;
    if (!s.transposed) {
      std::memcpy(out, rows, s.numel() * esize);
      return;
    }
    // Conv1D: (out, in) rows stored as (in, out); an element is moved, never converted.
    char* dst = static_cast<char*>(out);
    for (int64_t r = 0; r < s.rows; ++r)
      for (int64_t col = 0; col < s.cols; ++col)
        std::memcpy(dst + (col * s.rows + r) * esize, rows + (r * s.cols + col) * esize, esize);
  });
  const std::string text = config.dump(2) + "\n";
  write_file_atomically(dir + "/config.json", [&](std::FILE* f) { write_all(f, text.data(), text.size(), dir + "/config.json"); });
  const std::string source_generation = extras.source_dir + "/generation_config.json";
  if (!extras.source_dir.empty() && ::access(source_generation.c_str(), F_OK) == 0) {
    copy_file_atomically(source_generation, dir + "/generation_config.json");
  } else {
    nlohmann::ordered_json generation = {{"_from_model_config", true}};
    for (const char* key : {"bos_token_id", "eos_token_id"})
      if (config.contains(key)) generation[key] = config[key];
    const std::string g = generation.dump(2) + "\n";
    write_file_atomically(dir + "/generation_config.json",
                          [&](std::FILE* f) { write_all(f, g.data(), g.size(), dir + "/generation_config.json"); });
  }
  if (!extras.source_dir.empty())
    for (size_t i = 0; i < kNumHfTokenizerFiles; ++i) {
      const std::string from = extras.source_dir + "/" + kHfTokenizerFiles[i];
      if (::access(from.c_str(), F_OK) == 0) copy_file_atomically(from, dir + "/" + kHfTokenizerFiles[i]);
    }
  cleanup.armed = false;
  remove_sharded_layout(dir);
}

}  // namespace zerone::io
