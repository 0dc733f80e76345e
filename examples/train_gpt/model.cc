#include "model.h"

namespace gpt {

namespace m = tutti::models;

std::vector<std::string> model_names() {
  std::vector<std::string> names = m::GptConfig::preset_names();
  for (const std::string& n : m::LlamaConfig::preset_names()) names.push_back(n);
  return names;
}

ModelConfig model_config(const Flags& f, std::int64_t vocab) {
  if (!f.init_from.empty()) {
    TUTTI_CHECK_ARG(f.layers == 0 && f.heads == 0 && f.kv_heads == 0 && f.width == 0 && f.ffn == 0 && f.context == 0,
                    "--init-from ", f.init_from, ": the model's shape is the folder's (config.json); drop --layers, ",
                    "--heads, --kv-heads, --width, --ffn and --context");
    ModelConfig c = tutti::models::hf::read_config(f.init_from).model;
    std::visit([&](auto& m) { m.attention = tutti::nn::parse_attention_kernel(f.attention); }, c);
    if (auto* llama = std::get_if<m::LlamaConfig>(&c)) llama->validate();
    return c;
  }
  const bool llama = f.model.rfind("llama", 0) == 0;
  if (!llama) {
    TUTTI_CHECK_ARG(f.kv_heads == 0 && f.ffn == 0, "--kv-heads and --ffn are a Llama's; ", f.model,
                    " is a GPT (its MLP is 4 x --width, every head has its own keys and values)");
    m::GptConfig c = m::GptConfig::preset(f.model);
    if (f.layers > 0) c.layers = f.layers;
    if (f.heads > 0) c.heads = f.heads;
    if (f.width > 0) c.width = f.width;
    if (f.context > 0) c.context = f.context;
    c.attention = tutti::nn::parse_attention_kernel(f.attention);
    if (vocab > 0) {
      c.vocab = vocab;
      c.padded_vocab = vocab == 256 ? 256 : m::pad_vocab(vocab);
    }
    return c;
  }
  m::LlamaConfig c = m::LlamaConfig::preset(f.model);
  if (f.layers > 0) c.layers = f.layers;
  if (f.heads > 0) c.heads = f.heads;
  if (f.kv_heads > 0) c.kv_heads = f.kv_heads;
  if (f.width > 0) {
    c.width = f.width;
    c.head_size = 0;  // width / heads again
  }
  if (f.ffn > 0) c.ffn = f.ffn;
  if (f.context > 0) c.context = f.context;
  c.attention = tutti::nn::parse_attention_kernel(f.attention);
  if (vocab > 0) c.vocab = vocab;
  c.validate();
  return c;
}

std::unique_ptr<m::CausalLm> make_model(const ModelConfig& config, tutti::Communicator* tensor_parallel,
                                        const m::TensorParallelOptions& options) {
  return std::visit(
      [tensor_parallel, &options](const auto& c) -> std::unique_ptr<m::CausalLm> {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, m::GptConfig>) {
          return tensor_parallel ? std::make_unique<m::Gpt>(c, *tensor_parallel, options) : std::make_unique<m::Gpt>(c);
        } else {
          return tensor_parallel ? std::make_unique<m::Llama>(c, *tensor_parallel, options)
                                 : std::make_unique<m::Llama>(c);
        }
      },
      config);
}

std::function<std::string(const std::string&)> gather_groups(const ModelConfig& config) {
  if (const auto* llama = std::get_if<m::LlamaConfig>(&config)) return m::Llama::gather_groups(*llama);
  return m::Gpt::gather_group;  // a transformer layer per group
}

std::int64_t context_of(const ModelConfig& config) {
  return std::visit([](const auto& c) { return c.context; }, config);
}

std::string fingerprint_of(const ModelConfig& config) {
  return std::visit([](const auto& c) { return c.fingerprint(); }, config);
}

std::int32_t document_token(std::int64_t vocab) { return vocab > 65536 ? 128000 : 50256; }

tutti::train::MemoryPlan memory_plan(const ModelConfig& config, const tutti::train::PlanOptions& options) {
  return std::visit([&](const auto& c) { return tutti::train::memory_plan(c, options); }, config);
}

std::int64_t largest_micro_batch(const ModelConfig& config, const tutti::train::PlanOptions& options,
                                 std::int64_t device_bytes) {
  return std::visit([&](const auto& c) { return tutti::train::largest_micro_batch(c, options, device_bytes); }, config);
}

std::string fit_advice(const ModelConfig& config, const tutti::train::PlanOptions& options, std::int64_t device_bytes) {
  return std::visit([&](const auto& c) { return tutti::train::fit_advice(c, options, device_bytes); }, config);
}

}  // namespace gpt
