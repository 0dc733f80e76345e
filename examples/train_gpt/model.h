// The model train_gpt trains: a GPT-2 (--model gpt-tiny, gpt2-*) or a Llama (--model llama-tiny,
// llama3.*), its preset with the flags that override it, and what the trainer needs of either
// (tutti::models::CausalLm, ZeRO-3's gather groups, the memory plan).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <tutti/tutti.h>

#include "flags.h"

namespace gpt {

using ModelConfig = std::variant<tutti::models::GptConfig, tutti::models::LlamaConfig>;

// Every --model name: GPT's presets, then Llama's.
std::vector<std::string> model_names();

// The preset of --model with --layers, --heads, --kv-heads, --width, --ffn, --context and
// --attention applied, for a vocabulary of `vocab` tokens (0: the preset's own). A GPT pads it
// to a multiple of 128 (256 stays 256). InvalidArgument for a flag the model has not (--kv-heads,
// --ffn on a GPT). With --init-from, the folder's config.json instead (its vocabulary; the shape
// flags refused) and --attention.
ModelConfig model_config(const Flags& f, std::int64_t vocab);

// tensor_parallel: a GPT split over that group (models::Gpt(config, group, options)); nullptr: whole.
std::unique_ptr<tutti::models::CausalLm> make_model(const ModelConfig& config,
                                                    tutti::Communicator* tensor_parallel = nullptr,
                                                    const tutti::models::TensorParallelOptions& options = {});
std::function<std::string(const std::string&)> gather_groups(const ModelConfig& config);
std::int64_t context_of(const ModelConfig& config);
std::string fingerprint_of(const ModelConfig& config);
// The id a token-data sample starts from: the tokenizer's document token (GPT-2's
// <|endoftext|> 50256, Llama 3's <|begin_of_text|> 128000).
std::int32_t document_token(std::int64_t vocab);

tutti::train::MemoryPlan memory_plan(const ModelConfig& config, const tutti::train::PlanOptions& options);
std::int64_t largest_micro_batch(const ModelConfig& config, const tutti::train::PlanOptions& options,
                                 std::int64_t device_bytes);
std::string fit_advice(const ModelConfig& config, const tutti::train::PlanOptions& options, std::int64_t device_bytes);

}  // namespace gpt
