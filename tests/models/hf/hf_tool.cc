// The tutti side of the comparisons with Hugging Face transformers (hf_compare_test.py): loads a
// transformers folder into a models::Gpt or models::Llama (models/hf.h) and runs it on a batch
// that Python wrote.
//
//   hf_tool forward MODEL_DIR BATCH OUT_DIR [f32|bf16]
//       BATCH: a safetensors file of "tokens" and "targets", [B, T] I32. Writes
//       OUT_DIR/outputs.safetensors ("logits" [B, T, V] f32, "loss" [1] f32: the mean cross-entropy
//       of the logits against the targets) and OUT_DIR/grads/, a transformers folder whose tensors
//       are the loss's gradients under transformers' names.
//   hf_tool save MODEL_DIR OUT_DIR [f32|bf16|f16] [max_shard_bytes]
//       Loads MODEL_DIR and writes it back with hf::save: the round trip's other half.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <variant>

#include "tutti/tutti.h"

namespace {

using namespace tutti;

std::unique_ptr<models::CausalLm> load(const std::string& dir, DType compute) {
  const models::hf::Config c = models::hf::read_config(dir);
  std::unique_ptr<models::CausalLm> model;
  if (const auto* g = std::get_if<models::GptConfig>(&c.model))
    model = std::make_unique<models::Gpt>(*g);
  else
    model = std::make_unique<models::Llama>(std::get<models::LlamaConfig>(c.model));
  model->set_precision(compute);
  models::hf::load_weights(dir, *model);
  return model;
}

DType dtype_of(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "f16") return DType::f16;
  TUTTI_THROW(InvalidArgument, "dtype '", name, "': f32, bf16 or f16");
}

int forward(const std::string& model_dir, const std::string& batch, const std::string& out, DType compute) {
  const std::unique_ptr<models::CausalLm> model = load(model_dir, compute);
  const io::SafetensorsFile file(batch);
  const Tensor tokens = file.read("tokens"), targets = file.read("targets");
  const Tensor logits = model->forward(tokens);
  nn::CrossEntropyLoss loss;
  loss.forward(logits, targets);
  model->zero_grad();
  model->backward(loss.grad());
  std::filesystem::create_directories(out);
  Tensor f32 = Tensor::empty(logits.shape(), DType::f32);
  kernels::cast(logits, f32);
  io::save_safetensors(out + "/outputs.safetensors", {{"logits", f32}, {"loss", loss.loss()}});
  StateDict grads;
  for (nn::Parameter* p : model->parameters()) {
    Tensor g = Tensor::empty(p->shape(), DType::f32);
    kernels::cast(p->grad, g);
    grads[p->name] = g;
  }
  models::hf::save(out + "/grads", *model, grads);
  std::printf("hf_tool forward: %s, loss %.7f\n", model->describe().c_str(), nn::item(loss.loss()));
  return 0;
}

int save(const std::string& model_dir, const std::string& out, DType dtype, std::uint64_t shard) {
  const std::unique_ptr<models::CausalLm> model = load(model_dir, DType::f32);
  models::hf::ExportOptions o;
  o.dtype = dtype;
  if (shard > 0) o.max_shard_bytes = shard;
  models::hf::save(out, *model, model->state_dict(), o);
  std::printf("hf_tool save: %s to %s\n", model->describe().c_str(), out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "forward" && (argc == 5 || argc == 6))
      return forward(argv[2], argv[3], argv[4], dtype_of(argc == 6 ? argv[5] : "f32"));
    if (cmd == "save" && argc >= 4 && argc <= 6)
      return save(argv[2], argv[3], dtype_of(argc >= 5 ? argv[4] : "f32"),
                  argc == 6 ? std::strtoull(argv[5], nullptr, 10) : 0);
    std::fprintf(stderr,
                 "usage: hf_tool forward MODEL_DIR BATCH OUT_DIR [f32|bf16]\n"
                 "       hf_tool save MODEL_DIR OUT_DIR [f32|bf16|f16] [max_shard_bytes]\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_tool: error: %s\n", e.what());
    return 1;
  }
}
