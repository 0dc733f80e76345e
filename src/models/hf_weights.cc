// Hugging Face weights in and out (models/hf.h): transformers' tensor names mapped onto tutti's
// parameters, read one tensor at a time from a validated io::SafetensorsFolder, and written back.
#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "io/checkpoint_file.h"
#include "nn/slices.h"
#include "tutti/core/error.h"
#include "tutti/io/safetensors.h"
#include "tutti/models/hf.h"

namespace tutti::models::hf {
namespace {

std::string block(std::int64_t b) { return "blocks." + std::to_string(b) + ".body."; }

// The model's configuration, by its type.
std::variant<GptConfig, LlamaConfig> config_of(const CausalLm& model) {
  if (const auto* g = dynamic_cast<const Gpt*>(&model)) return g->config();
  if (const auto* l = dynamic_cast<const Llama*>(&model)) return l->config();
  TUTTI_THROW(InvalidArgument, "Hugging Face weights: ", model.describe(), " is neither a Gpt nor a Llama");
}

std::vector<TensorMap> map_of(const std::variant<GptConfig, LlamaConfig>& c) {
  return std::visit([](const auto& config) { return tensor_map(config); }, c);
}

// Tensors of older or tied releases that tutti neither needs nor has.
bool ignorable(const std::string& name, bool tied) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return (tied && name == "lm_head.weight") || ends(".attn.bias") || ends(".attn.masked_bias") ||
         ends(".rotary_emb.inv_freq");
}

bool tied_of(const std::variant<GptConfig, LlamaConfig>& c) {
  if (const auto* l = std::get_if<LlamaConfig>(&c)) return l->tied_head;
  return true;  // GPT-2's head is its embedding
}

// The folder's name of a tensor: as mapped, or, for GPT-2, without the "transformer." prefix that
// the original OpenAI release's files lack.
std::string stored_name(const io::SafetensorsFolder& folder, const std::string& name) {
  const std::string prefix = "transformer.";
  if (!folder.contains(name) && name.rfind(prefix, 0) == 0 && folder.contains(name.substr(prefix.size())))
    return name.substr(prefix.size());
  return name;
}

// Checks the model against the folder's config.json: the same shape (a GPT may pad its vocabulary).
void check_shape(const std::string& dir, const std::variant<GptConfig, LlamaConfig>& model, const Config& file) {
  bool same = model.index() == file.model.index();
  if (same && model.index() == 0) {
    const GptConfig &m = std::get<GptConfig>(model), &f = std::get<GptConfig>(file.model);
    same = m.vocab == f.vocab && m.padded_vocab >= f.vocab && m.context == f.context && m.layers == f.layers &&
           m.heads == f.heads && m.width == f.width;
  } else if (same) {
    same = std::get<LlamaConfig>(model).fingerprint() == std::get<LlamaConfig>(file.model).fingerprint() &&
           std::get<LlamaConfig>(model).norm_eps == std::get<LlamaConfig>(file.model).norm_eps;
  }
  const auto fingerprint = [](const auto& c) { return c.fingerprint(); };
  TUTTI_CHECK_ARG(same, "Hugging Face folder '", dir, "' holds a ", file.model_type, " of shape ",
                  std::visit(fingerprint, file.model), " (config.json), but the model is ",
                  std::visit(fingerprint, model), ": build it from hf::read_config");
}

}  // namespace

std::vector<TensorMap> tensor_map(const GptConfig& c) {
  const std::int64_t C = c.width;
  std::vector<TensorMap> m;
  m.push_back({"transformer.wte.weight", {c.vocab, C}, "embed.wte", 0, false});
  m.push_back({"transformer.wpe.weight", {c.context, C}, "embed.wpe", 0, false});
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".", a = block(2 * l), p = block(2 * l + 1);
    m.push_back({h + "ln_1.weight", {C}, a + "0.gamma", 0, false});
    m.push_back({h + "ln_1.bias", {C}, a + "0.beta", 0, false});
    m.push_back({h + "attn.c_attn.weight", {C, 3 * C}, a + "1.weight", 0, true});  // Conv1D: [in, out]
    m.push_back({h + "attn.c_attn.bias", {3 * C}, a + "1.bias", 0, false});
    m.push_back({h + "attn.c_proj.weight", {C, C}, a + "3.weight", 0, true});
    m.push_back({h + "attn.c_proj.bias", {C}, a + "3.bias", 0, false});
    m.push_back({h + "ln_2.weight", {C}, p + "0.gamma", 0, false});
    m.push_back({h + "ln_2.bias", {C}, p + "0.beta", 0, false});
    m.push_back({h + "mlp.c_fc.weight", {C, 4 * C}, p + "1.weight", 0, true});
    m.push_back({h + "mlp.c_fc.bias", {4 * C}, p + "1.bias", 0, false});
    m.push_back({h + "mlp.c_proj.weight", {4 * C, C}, p + "3.weight", 0, true});
    m.push_back({h + "mlp.c_proj.bias", {C}, p + "3.bias", 0, false});
  }
  m.push_back({"transformer.ln_f.weight", {C}, "ln_f.gamma", 0, false});
  m.push_back({"transformer.ln_f.bias", {C}, "ln_f.beta", 0, false});
  return m;
}

std::vector<TensorMap> tensor_map(const LlamaConfig& c) {
  const std::int64_t C = c.width, hs = c.head_dim(), H = c.heads, G = c.kv_heads, F = c.ffn;
  std::vector<TensorMap> m;
  m.push_back({"model.embed_tokens.weight", {c.vocab, C}, "embed.weight", 0, false});
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".", a = block(2 * l), p = block(2 * l + 1);
    // The q, k and v heads are the rows of one Linear, in that order; gate and up likewise.
    m.push_back({h + "self_attn.q_proj.weight", {H * hs, C}, a + "1.weight", 0, false});
    m.push_back({h + "self_attn.k_proj.weight", {G * hs, C}, a + "1.weight", H * hs, false});
    m.push_back({h + "self_attn.v_proj.weight", {G * hs, C}, a + "1.weight", (H + G) * hs, false});
    m.push_back({h + "self_attn.o_proj.weight", {C, H * hs}, a + "4.weight", 0, false});
    m.push_back({h + "mlp.gate_proj.weight", {F, C}, p + "1.weight", 0, false});
    m.push_back({h + "mlp.up_proj.weight", {F, C}, p + "1.weight", F, false});
    m.push_back({h + "mlp.down_proj.weight", {C, F}, p + "3.weight", 0, false});
    m.push_back({h + "input_layernorm.weight", {C}, a + "0.weight", 0, false});
    m.push_back({h + "post_attention_layernorm.weight", {C}, p + "0.weight", 0, false});
  }
  m.push_back({"model.norm.weight", {C}, "norm.weight", 0, false});
  if (!c.tied_head) m.push_back({"lm_head.weight", {c.vocab, C}, "head.weight", 0, false});
  return m;
}

void load_weights(const std::string& dir, CausalLm& model, const LoadProgress& progress) {
  const std::variant<GptConfig, LlamaConfig> shape = config_of(model);
  const Config file = read_config(dir);
  check_shape(dir, shape, file);
  const auto folder_ptr = std::make_shared<const io::SafetensorsFolder>(dir);  // every header validated here
  const io::SafetensorsFolder& folder = *folder_ptr;
  const std::vector<TensorMap> map = map_of(shape);
  // Everything checked before anything is loaded: each tensor present, of its shape and a float
  // dtype (config.json's when it names one); nothing left over.
  std::set<std::string> mapped;
  for (const TensorMap& t : map) {
    const std::string name = stored_name(folder, t.hf_name);
    mapped.insert(name);
    TUTTI_CHECK_ARG(folder.contains(name), "Hugging Face folder '", dir, "': tensor '", t.hf_name,
                    "' is missing (the model needs it for ", t.param, ")");
    const io::SafetensorsEntry& e = folder.entry(name);
    const std::string where = "Hugging Face file '" + folder.file_of(name).path() + "': tensor '" + name + "'";
    TUTTI_CHECK_ARG(e.shape == t.hf_shape, where, " has shape ", shape_str(e.shape), " but config.json's model needs ",
                    shape_str(t.hf_shape));
    TUTTI_CHECK_ARG(e.tutti_dtype && is_floating(*e.tutti_dtype), where, " is ", e.dtype,
                    "; weights must be F32, BF16 or F16");
    TUTTI_CHECK_ARG(!file.dtype || *e.tutti_dtype == *file.dtype, where, " is ", e.dtype,
                    " but config.json's torch_dtype says ", name_of(*file.dtype));
  }
  const bool tied = tied_of(shape);
  for (const std::string& name : folder.names()) {
    TUTTI_CHECK_ARG(mapped.count(name) || ignorable(name, tied), "Hugging Face file '", folder.file_of(name).path(),
                    "': tensor '", name, "' belongs to no parameter of ", model.describe());
  }
  // What each parameter is filled from; shared by the sources of a deferred model, which read
  // when the parameter is materialized.
  struct Reading {
    std::shared_ptr<const io::SafetensorsFolder> folder;
    std::map<std::string, std::vector<TensorMap>> by_param;
    std::int64_t total = 0, read = 0;
    LoadProgress progress;
  };
  auto reading = std::make_shared<Reading>();
  reading->folder = folder_ptr;
  reading->progress = progress;
  for (const TensorMap& t : map) {
    reading->total += static_cast<std::int64_t>(folder.entry(stored_name(folder, t.hf_name)).nbytes());
    reading->by_param[t.param].push_back(t);
  }
  // One parameter's rows from each of its tensors, on the host in f32.
  const auto fill = [](Reading& r, const std::string& param, Tensor& host) {
    const io::SafetensorsFolder& f = *r.folder;
    const std::int64_t cols = host.shape().size() == 2 ? host.shape()[1] : 1;
    host.zero();  // a GPT's padded vocabulary rows stay 0
    for (const TensorMap& t : r.by_param.at(param)) {
      const std::string name = stored_name(f, t.hf_name);
      const std::int64_t n = numel_of(t.hf_shape);
      r.read += static_cast<std::int64_t>(f.entry(name).nbytes());
      if (!t.transposed) {
        f.read_elements_into(name, 0, host.view(t.row_begin * cols, {n}));
        continue;
      }
      // Conv1D's [in, out] into tutti's [out, in] rows.
      const Tensor stored = f.read(name, DType::f32);
      const std::int64_t in = t.hf_shape[0], out = t.hf_shape[1];
      const float* src = stored.data_as<float>();
      float* dst = host.data_as<float>() + t.row_begin * cols;
      for (std::int64_t i = 0; i < in; ++i)
        for (std::int64_t o = 0; o < out; ++o) dst[o * in + i] = src[i * out + o];
    }
    if (r.progress) r.progress(r.read, r.total);
  };
  const Stream& stream = model.stream();
  for (nn::Parameter* p : model.parameters()) {
    TUTTI_CHECK_ARG(reading->by_param.count(p->name), "Hugging Face weights: no tensor maps to ", p->name);
    if (p->init_slice.full.empty()) {
      p->source = [reading, fill, name = p->name](Tensor& host) { fill(*reading, name, host); };
    } else {
      // Split over a tensor-parallel group (Parameter::init_slice): the whole tensor, one at a
      // time, and this rank's slice of it.
      p->source = [reading, fill, name = p->name, slice = p->init_slice](Tensor& host) {
        Tensor whole = Tensor::empty(slice.full, DType::f32);
        fill(*reading, name, whole);
        nn::take_slice(whole, slice, host);
      };
    }
    p->initialized = true;
    if (p->deferred) continue;  // read when it is materialized (nn::DeferredParameters)
    nn::fill_from_source(*p, p->value, stream);
    p->source = nullptr;
  }
  model.refresh_compute_copies();
  stream.synchronize();
}

namespace {

void save_shape(const std::string& dir, const std::variant<GptConfig, LlamaConfig>& shape, const std::string& what,
                const StateDict& state, const ExportOptions& options) {
  TUTTI_CHECK_ARG(options.dtype == DType::f32 || options.dtype == DType::bf16 || options.dtype == DType::f16,
                  "Hugging Face export: weights are f32, bf16 or f16, not ", name_of(options.dtype));
  io::NamedTensors tensors;
  for (const TensorMap& t : map_of(shape)) {
    const auto it = state.find(t.param);
    TUTTI_CHECK_ARG(it != state.end(), "Hugging Face export: the state has no '", t.param, "' (", what, ")");
    const Tensor& whole = it->second;
    const std::int64_t cols = whole.ndim() == 2 ? whole.dim(1) : 1, n = numel_of(t.hf_shape);
    const std::int64_t rows_needed = t.transposed ? t.hf_shape[1] : (t.hf_shape.empty() ? 1 : t.hf_shape[0]);
    TUTTI_CHECK_ARG(
        whole.device().is_cpu() && whole.dtype() == DType::f32 && whole.numel() >= (t.row_begin + rows_needed) * cols,
        "Hugging Face export: '", t.param, "' is ", whole.str(), "; expected f32 on the CPU holding ", t.hf_name, " ",
        shape_str(t.hf_shape));
    // Views of the state where the rows are the tensor as it is (no copy); a new tensor where
    // GPT-2's Conv1D needs the transpose or the dtype changes.
    if (!t.transposed && options.dtype == DType::f32) {
      tensors.emplace_back(t.hf_name, whole.view(t.row_begin * cols, t.hf_shape));
      continue;
    }
    std::vector<float> v(static_cast<std::size_t>(n));
    const float* src = whole.data_as<float>() + t.row_begin * cols;
    if (!t.transposed) {
      std::copy(src, src + n, v.begin());
    } else {
      const std::int64_t in = t.hf_shape[0], out = t.hf_shape[1];
      for (std::int64_t i = 0; i < in; ++i)
        for (std::int64_t o = 0; o < out; ++o) v[static_cast<std::size_t>(i * out + o)] = src[o * in + i];
    }
    tensors.emplace_back(t.hf_name, Tensor::from_floats(v, t.hf_shape, options.dtype));
  }
  io::SafetensorsFolderOptions fo;
  fo.max_shard_bytes = options.max_shard_bytes;
  io::save_safetensors_folder(dir, tensors, {{"format", "pt"}}, fo);
  const std::string json = std::visit([&](const auto& c) { return config_json(c, options.dtype); }, shape);
  io::detail::write_file_atomically(dir + "/config.json", json.data(), json.size());
}

}  // namespace

void save(const std::string& dir, const CausalLm& model, const StateDict& state, const ExportOptions& options) {
  save_shape(dir, config_of(model), model.describe(), state, options);
}

void save(const std::string& dir, const GptConfig& config, const StateDict& state, const ExportOptions& options) {
  save_shape(dir, config, config.fingerprint(), state, options);
}

void save(const std::string& dir, const LlamaConfig& config, const StateDict& state, const ExportOptions& options) {
  save_shape(dir, config, config.fingerprint(), state, options);
}

}  // namespace tutti::models::hf
