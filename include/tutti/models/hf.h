// Hugging Face model folders in and out: a GPT-2 (GPT2LMHeadModel) or a Llama (LlamaForCausalLM)
// as transformers' save_pretrained writes it — config.json and safetensors weights (one file, or
// shards and model.safetensors.index.json) under transformers' tensor names — loaded into a
// models::Gpt or models::Llama, and a trained model written back so that transformers'
// from_pretrained loads it (tests/models/hf checks both ways against transformers itself).
//
// doc-test: wrap-main
// setup: tutti::Job job(argc, argv);
//   const tutti::models::hf::Config c = tutti::models::hf::read_config("Llama-3.2-1B");
//   const auto& shape = std::get<tutti::models::LlamaConfig>(c.model);
//   tutti::models::Llama model(shape);
//   model.to(job.device());
//   tutti::models::hf::load_weights("Llama-3.2-1B", model);   // every rank, before DDP
//   tutti::ddp::DdpOptions options{
//       .sharding = tutti::ddp::ShardParameters{.gather_group = tutti::models::Llama::gather_groups(shape)}};
//   tutti::ddp::DistributedDataParallel ddp(job.communicator(), model, options);
//   // ... train (docs/bring-your-own-model.md has the whole program) ...
//   const tutti::StateDict state = ddp.state().model_state_dict();       // COLLECTIVE: every rank
//   if (job.rank() == 0) tutti::models::hf::save("out", model, state);
//
// The names: GPT-2's "transformer.wte.weight", "transformer.h.<l>.attn.c_attn.weight" (a Conv1D,
// stored [in, out]: transposed on the way in and out), ...; Llama's "model.embed_tokens.weight",
// "model.layers.<l>.self_attn.q_proj.weight" (q, k and v are one tutti Linear whose rows they fill
// in turn; gate and up likewise), ..., "lm_head.weight" (absent when tied). tensor_map lists them.
//
// Untrusted input: every file is validated by io::SafetensorsFolder before anything is read, and
// a config.json that is not JSON, lacks a key, or asks for what tutti does not build (biases in a
// Llama's projections, another activation, another rope type, cross-attention...), a tensor
// missing or left over, or a tensor whose dtype or shape disagrees with config.json throws
// InvalidArgument naming the file and the key or tensor, before any tensor is loaded. Nothing here
// is collective.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tutti/core/state_dict.h"
#include "tutti/models/gpt.h"
#include "tutti/models/llama.h"

namespace tutti::models::hf {

// A folder's config.json as tutti reads it.
struct Config {
  std::variant<GptConfig, LlamaConfig> model;  // the shape; a GPT's vocabulary padded as llm.c pads it
  std::string model_type;                      // "gpt2" or "llama"
  std::optional<DType> dtype;                  // torch_dtype: what the weights are stored as, when it says
};

// Reads <dir>/config.json ("model_type" gpt2 or llama).
Config read_config(const std::string& dir);
// The same from the text of a config.json; `source` names it in errors (a file, a checkpoint's
// metadata).
Config parse_config(const std::string& json_text, const std::string& source);

// The config.json transformers writes for such a model with weights stored in `dtype`.
std::string config_json(const GptConfig& config, DType dtype);
std::string config_json(const LlamaConfig& config, DType dtype);

// One tensor of a folder and where it goes: rows [row_begin, row_begin + rows) of tutti's
// parameter `param`, transposed for GPT-2's Conv1D weights.
struct TensorMap {
  std::string hf_name;
  Shape hf_shape;
  std::string param;
  std::int64_t row_begin = 0;
  bool transposed = false;
};
// Every tensor transformers saves for the model, in its order; each tutti parameter's rows are
// covered exactly once (but a GPT's padded vocabulary rows, which stay 0).
std::vector<TensorMap> tensor_map(const GptConfig& config);
std::vector<TensorMap> tensor_map(const LlamaConfig& config);

// Loads the weights of the folder `dir` into `model` (a Gpt or Llama of read_config(dir)'s shape:
// InvalidArgument otherwise) one tensor at a time, converted to f32 on the host and copied to its
// parameter on the model's device: host memory for one parameter at a time, never the whole
// model. Then refreshes the compute copies and marks every parameter initialized. Call it before
// handing the model to DistributedDataParallel (every rank reads the folder). Synchronizes.
// Tensors transformers keeps but tutti has no use for are skipped: a tied "lm_head.weight", older
// releases' buffers ("*.attn.bias", "*.attn.masked_bias", "*.rotary_emb.inv_freq").
// `progress`, when given, is called after each parameter with the bytes of the folder's tensors
// read so far and in all (a large model takes a while: a program can say how far it is).
// A model split over a tensor-parallel group (Gpt(config, group), Llama(config, group)) reads
// each split parameter's whole tensor and keeps its slice (Parameter::init_slice): host memory
// for one whole parameter at a time.
// On a model with deferred parameters (nn::DeferredParameters) nothing is read here but the
// headers: each parameter's source reads its tensors when it is materialized (by
// DistributedDataParallel, one ZeRO-3 gather group at a time, or Module::materialize), and
// `progress` is called then, so it must outlive that.
using LoadProgress = std::function<void(std::int64_t bytes_read, std::int64_t bytes_total)>;
void load_weights(const std::string& dir, CausalLm& model, const LoadProgress& progress = {});

struct ExportOptions {
  DType dtype = DType::f32;                       // the weights' dtype in the files (f32, bf16 or f16)
  std::uint64_t max_shard_bytes = 5'000'000'000;  // above it, shards and an index (transformers' 5GB)
};

// Writes a Hugging Face folder for `model`'s shape: config.json and the weights of `state` (a
// whole model state dict, model.state_dict() or DdpState::model_state_dict(), CPU
// tensors) under transformers' names, in options.dtype, each file atomically; the folder is
// created when missing and files of another shard count removed. InvalidArgument when a
// parameter is missing from `state` or has another shape. Call it on one rank.
void save(const std::string& dir, const CausalLm& model, const StateDict& state, const ExportOptions& options = {});
// The same for a configuration, without a model built (a checkpoint's state converted).
void save(const std::string& dir, const GptConfig& config, const StateDict& state, const ExportOptions& options = {});
void save(const std::string& dir, const LlamaConfig& config, const StateDict& state, const ExportOptions& options = {});

}  // namespace tutti::models::hf
