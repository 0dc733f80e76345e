// config.json of Hugging Face GPT-2 and Llama folders: read into tutti's configurations, and
// written as transformers writes it (models/hf.h).
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tutti/core/error.h"
#include "tutti/models/hf.h"

namespace tutti::models::hf {
namespace {

using nlohmann::json;

// A config.json being read: its path for messages, its object.
struct ConfigFile {
  std::string path;
  json j;

  bool has(const std::string& key) const { return j.contains(key) && !j.at(key).is_null(); }
  const json& at(const std::string& key) const {
    TUTTI_CHECK_ARG(has(key), "Hugging Face config '", path, "': no \"", key, "\"");
    return j.at(key);
  }
  std::int64_t positive(const std::string& key) const {
    const json& v = at(key);
    TUTTI_CHECK_ARG(v.is_number_integer() && v.get<std::int64_t>() > 0, "Hugging Face config '", path, "': \"", key,
                    "\" must be a positive integer, got ", v.dump());
    return v.get<std::int64_t>();
  }
  double number(const std::string& key) const {
    const json& v = at(key);
    TUTTI_CHECK_ARG(v.is_number(), "Hugging Face config '", path, "': \"", key, "\" must be a number, got ", v.dump());
    return v.get<double>();
  }
  bool flag(const std::string& key, bool otherwise) const {
    if (!has(key)) return otherwise;
    const json& v = j.at(key);
    TUTTI_CHECK_ARG(v.is_boolean(), "Hugging Face config '", path, "': \"", key, "\" must be true or false, got ",
                    v.dump());
    return v.get<bool>();
  }
  std::string text(const std::string& key) const {
    const json& v = at(key);
    TUTTI_CHECK_ARG(v.is_string(), "Hugging Face config '", path, "': \"", key, "\" must be a string, got ", v.dump());
    return v.get<std::string>();
  }
  // A setting tutti has only one value of: absent, null or that value.
  template <typename V>
  void require(const std::string& key, const V& value, const std::string& why) const {
    TUTTI_CHECK_ARG(!has(key) || j.at(key) == json(value), "Hugging Face config '", path, "': \"", key, "\" is ",
                    j.at(key).dump(), "; tutti builds ", json(value).dump(), " only (", why, ")");
  }
};

ConfigFile parse(const std::string& text, const std::string& source) {
  ConfigFile f{source, json::parse(text, nullptr, /*allow_exceptions=*/false)};
  TUTTI_CHECK_ARG(!f.j.is_discarded() && f.j.is_object(), "Hugging Face config '", f.path, "': not a JSON object");
  return f;
}

std::optional<DType> torch_dtype(const ConfigFile& f) {
  // transformers 5 writes "dtype", earlier releases "torch_dtype".
  const std::string key = f.has("dtype") ? "dtype" : "torch_dtype";
  if (!f.has(key)) return std::nullopt;
  const std::string t = f.text(key);
  if (t == "float32") return DType::f32;
  if (t == "bfloat16") return DType::bf16;
  if (t == "float16") return DType::f16;
  TUTTI_THROW(InvalidArgument, "Hugging Face config '", f.path, "': \"", key, "\" is \"", t,
              "\"; tutti reads float32, bfloat16 and float16 weights");
}

const char* torch_name(DType d) {
  switch (d) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: break;
  }
  TUTTI_THROW(InvalidArgument, "Hugging Face export: weights are f32, bf16 or f16, not ", name_of(d));
}

GptConfig gpt_of(const ConfigFile& f) {
  GptConfig c;
  c.width = f.positive("n_embd");
  c.layers = f.positive("n_layer");
  c.heads = f.positive("n_head");
  c.context = f.positive("n_positions");
  c.vocab = f.positive("vocab_size");
  // Not padded: the padded columns' logits would be 0, not -inf, in the softmax of a loaded model.
  c.padded_vocab = c.vocab;
  TUTTI_CHECK_ARG(c.width % c.heads == 0, "Hugging Face config '", f.path, "': n_head ", c.heads,
                  " does not divide n_embd ", c.width);
  if (f.has("n_inner"))
    TUTTI_CHECK_ARG(f.positive("n_inner") == 4 * c.width, "Hugging Face config '", f.path, "': \"n_inner\" is ",
                    f.positive("n_inner"), "; tutti's GPT-2 MLP is 4 x n_embd = ", 4 * c.width);
  const std::string act = f.has("activation_function") ? f.text("activation_function") : "gelu_new";
  TUTTI_CHECK_ARG(act == "gelu_new" || act == "gelu_pytorch_tanh", "Hugging Face config '", f.path,
                  "': \"activation_function\" is \"", act,
                  "\"; tutti's GELU is the tanh approximation (gelu_new, gelu_pytorch_tanh)");
  if (f.has("layer_norm_epsilon"))
    TUTTI_CHECK_ARG(f.number("layer_norm_epsilon") == 1e-5, "Hugging Face config '", f.path,
                    "': \"layer_norm_epsilon\" is ", f.number("layer_norm_epsilon"), "; tutti's GPT uses 1e-5");
  f.require("scale_attn_weights", true, "scores are scaled by 1/sqrt(head size)");
  f.require("scale_attn_by_inverse_layer_idx", false, "no per-layer scaling of the scores");
  f.require("add_cross_attention", false, "a decoder without cross-attention");
  f.require("tie_word_embeddings", true, "GPT-2's head is its token embedding");
  return c;
}

// rope_theta and rope_scaling (transformers 4), or rope_parameters (transformers 5).
nn::RopeOptions rope_of(const ConfigFile& f) {
  nn::RopeOptions r;
  const json* params = nullptr;
  if (f.has("rope_parameters")) {
    params = &f.at("rope_parameters");
    TUTTI_CHECK_ARG(params->is_object() && params->contains("rope_theta") && params->at("rope_theta").is_number(),
                    "Hugging Face config '", f.path, "': \"rope_parameters\" needs a numeric \"rope_theta\", got ",
                    params->dump());
    r.theta = params->at("rope_theta").get<double>();
  } else {
    if (f.has("rope_theta")) r.theta = f.number("rope_theta");
    if (f.has("rope_scaling")) params = &f.at("rope_scaling");
  }
  if (params == nullptr) return r;
  TUTTI_CHECK_ARG(params->is_object(), "Hugging Face config '", f.path, "': rope scaling must be an object, got ",
                  params->dump());
  const std::string type_key = params->contains("rope_type") ? "rope_type" : "type";
  const std::string type = params->contains(type_key) && params->at(type_key).is_string()
                               ? params->at(type_key).get<std::string>()
                               : "default";
  if (type == "default") return r;
  TUTTI_CHECK_ARG(type == "llama3", "Hugging Face config '", f.path, "': rope type \"", type,
                  "\"; tutti builds the default rotary embedding and Llama 3's scaling (\"llama3\")");
  auto num = [&](const char* key) {
    TUTTI_CHECK_ARG(params->contains(key) && params->at(key).is_number(), "Hugging Face config '", f.path,
                    "': llama3 rope scaling needs a numeric \"", key, "\", got ", params->dump());
    return params->at(key).get<double>();
  };
  r.scaling.factor = num("factor");
  r.scaling.low_freq_factor = num("low_freq_factor");
  r.scaling.high_freq_factor = num("high_freq_factor");
  r.scaling.original_context = static_cast<std::int64_t>(num("original_max_position_embeddings"));
  return r;
}

LlamaConfig llama_of(const ConfigFile& f) {
  LlamaConfig c;
  c.width = f.positive("hidden_size");
  c.ffn = f.positive("intermediate_size");
  c.layers = f.positive("num_hidden_layers");
  c.heads = f.positive("num_attention_heads");
  c.kv_heads = f.has("num_key_value_heads") ? f.positive("num_key_value_heads") : c.heads;
  c.vocab = f.positive("vocab_size");
  c.context = f.positive("max_position_embeddings");
  c.head_size = f.has("head_dim") ? f.positive("head_dim") : 0;
  if (c.head_size * c.heads == c.width) c.head_size = 0;  // the default: width / heads
  if (f.has("rms_norm_eps")) c.norm_eps = static_cast<float>(f.number("rms_norm_eps"));
  c.rope = rope_of(f);
  c.tied_head = f.flag("tie_word_embeddings", false);
  f.require("hidden_act", "silu", "SwiGLU's gate is SiLU");
  f.require("attention_bias", false, "the projections have no bias");
  f.require("mlp_bias", false, "the projections have no bias");
  f.require("pretraining_tp", 1, "tensor-parallel slicing of the projections is only for Meta's original code");
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    TUTTI_THROW(InvalidArgument, "Hugging Face config '", f.path, "': ", e.what());
  }
  return c;
}

}  // namespace

Config read_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  TUTTI_CHECK_ARG(in.good(), "Hugging Face folder '", dir, "': no readable config.json");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path);
}

Config parse_config(const std::string& json_text, const std::string& source) {
  const ConfigFile f = parse(json_text, source);
  Config c;
  c.model_type = f.text("model_type");
  c.dtype = torch_dtype(f);
  if (c.model_type == "gpt2")
    c.model = gpt_of(f);
  else if (c.model_type == "llama")
    c.model = llama_of(f);
  else
    TUTTI_THROW(InvalidArgument, "Hugging Face config '", f.path, "': model_type \"", c.model_type,
                "\"; tutti builds gpt2 (GPT2LMHeadModel) and llama (LlamaForCausalLM)");
  return c;
}

std::string config_json(const GptConfig& c, DType dtype) {
  json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["activation_function"] = "gelu_new";
  j["n_embd"] = c.width;
  j["n_layer"] = c.layers;
  j["n_head"] = c.heads;
  j["n_positions"] = c.context;
  j["n_ctx"] = c.context;
  j["n_inner"] = nullptr;
  j["vocab_size"] = c.vocab;
  j["layer_norm_epsilon"] = 1e-5;
  j["initializer_range"] = 0.02;
  // tutti trains GPT-2 without dropout.
  j["attn_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["resid_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = true;
  j["use_cache"] = true;
  if (c.vocab == 50257) j["bos_token_id"] = j["eos_token_id"] = 50256;
  j["torch_dtype"] = torch_name(dtype);
  return j.dump(2) + "\n";
}

std::string config_json(const LlamaConfig& c, DType dtype) {
  json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = c.width;
  j["intermediate_size"] = c.ffn;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim();
  j["vocab_size"] = c.vocab;
  j["max_position_embeddings"] = c.context;
  j["rms_norm_eps"] = static_cast<double>(c.norm_eps);
  j["rope_theta"] = c.rope.theta;
  if (c.rope.scaling.factor > 0) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope.scaling.factor},
                         {"low_freq_factor", c.rope.scaling.low_freq_factor},
                         {"high_freq_factor", c.rope.scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope.scaling.original_context}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["pretraining_tp"] = 1;
  j["initializer_range"] = 0.02;
  j["tie_word_embeddings"] = c.tied_head;
  j["use_cache"] = true;
  if (c.vocab == 128256) {  // Llama 3's tokenizer: <|begin_of_text|>, <|end_of_text|>
    j["bos_token_id"] = 128000;
    j["eos_token_id"] = 128001;
  }
  j["torch_dtype"] = torch_name(dtype);
  return j.dump(2) + "\n";
}

}  // namespace tutti::models::hf
