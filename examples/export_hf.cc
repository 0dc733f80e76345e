// export_hf: a train_gpt checkpoint as a Hugging Face folder (config.json and safetensors under
// transformers' names) that transformers' from_pretrained loads (tutti/models/hf.h).
//
//   build/examples/export_hf ckpt/checkpoint.tckp out/ [--dtype bf16] [--max-shard-bytes 5000000000]
//
// The model's shape comes from the checkpoint's metadata ("model_config", which train_gpt writes
// into every checkpoint); its weights are the checkpoint's "model." tensors. Not collective: run it
// once, anywhere the checkpoint is. train_gpt --export DIR writes the same folder at the end of a run.
#include <cstdio>
#include <limits>
#include <string>

#include <tutti/tutti.h>
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  std::string checkpoint, out, dtype = "f32";
  std::uint64_t shard = 5'000'000'000;
  CLI::App app{"Writes a train_gpt checkpoint as a Hugging Face folder (config.json, safetensors)"};
  app.add_option("checkpoint", checkpoint, "a checkpoint train_gpt wrote (--checkpoint-dir DIR: DIR/checkpoint.tckp)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("out", out, "the folder to write (created when missing)")->required();
  app.add_option("--dtype", dtype, "the weights' dtype in the files")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--max-shard-bytes", shard, "bytes of weights per file; more go to shards and an index")
      ->check(CLI::Range(std::uint64_t{1}, std::numeric_limits<std::uint64_t>::max()))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const tutti::io::Checkpoint ckpt = tutti::io::load_checkpoint(checkpoint);
    const auto it = ckpt.metadata.find("model_config");
    TUTTI_CHECK_ARG(it != ckpt.metadata.end(), "checkpoint '", checkpoint,
                    "' has no \"model_config\" metadata: it was not written by train_gpt, or by a train_gpt older than "
                    "export_hf (resume it with train_gpt --resume ... --export DIR instead)");
    const tutti::models::hf::Config config =
        tutti::models::hf::parse_config(it->second, "checkpoint '" + checkpoint + "' (model_config)");
    const tutti::StateDict state = tutti::io::strip_prefix(ckpt.state, "model.");
    tutti::models::hf::ExportOptions o;
    o.dtype = dtype == "bf16" ? tutti::DType::bf16 : dtype == "f16" ? tutti::DType::f16 : tutti::DType::f32;
    o.max_shard_bytes = shard;
    std::visit([&](const auto& c) { tutti::models::hf::save(out, c, state, o); }, config.model);
    const auto step = ckpt.metadata.find("train.step");
    std::printf("export_hf: %s (%s%s) from %s to %s, %s weights\n", config.model_type.c_str(),
                std::visit([](const auto& c) { return c.fingerprint(); }, config.model).c_str(),
                step != ckpt.metadata.end() ? (", step " + step->second).c_str() : "", checkpoint.c_str(), out.c_str(),
                dtype.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "export_hf: error: %s\n", e.what());
    return 1;
  }
}
