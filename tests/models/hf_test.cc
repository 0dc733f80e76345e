// models/hf (src/models/hf_*.cc) without Python: the tensor maps cover every parameter row once;
// save then load gives the same parameters (GPT with a padded vocabulary, Llama tied and untied,
// one file and shards, f32 and bf16); config.json round-trips; bad folders and configs are refused
// naming the file and the key or tensor, before anything is loaded. The comparison with
// transformers itself: hf/hf_compare_test.py.
#include "tutti/models/hf.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "kernels/kernel_test_util.h"
#include "tutti/io/safetensors.h"

namespace tutti::models::hf {
namespace {

namespace fs = std::filesystem;
using testing::expect_invalid_argument;

LlamaConfig small_llama(bool tied) {
  LlamaConfig c;
  c.vocab = 40;
  c.context = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.width = 16;
  c.ffn = 24;
  c.tied_head = tied;
  c.rope = {500000.0, {8.0, 1.0, 4.0, 8}};
  return c;
}

GptConfig small_gpt(bool padded) {
  GptConfig c;
  c.vocab = 40;
  c.padded_vocab = padded ? 128 : 40;
  c.context = 16;
  c.layers = 2;
  c.heads = 2;
  c.width = 8;
  return c;
}

struct Folder {
  fs::path dir;
  explicit Folder(const std::string& name) : dir(fs::temp_directory_path() / ("tutti-hf-" + name)) {
    fs::remove_all(dir);
  }
  ~Folder() { fs::remove_all(dir); }
  std::string str() const { return dir.string(); }
};

// A model with random values (init), and its state.
template <typename M, typename C>
std::unique_ptr<M> random_model(const C& c, std::uint64_t seed) {
  auto m = std::make_unique<M>(c);
  m->init(seed);
  return m;
}

template <typename C>
void expect_maps_cover_every_row_once(const C& c, std::int64_t padded_rows) {
  auto model = random_model<std::conditional_t<std::is_same_v<C, GptConfig>, Gpt, Llama>>(c, 1);
  std::map<std::string, std::int64_t> rows;
  for (const TensorMap& t : tensor_map(c)) rows[t.param] += t.transposed ? t.hf_shape[1] : t.hf_shape[0];
  for (nn::Parameter* p : model->parameters()) {
    const std::int64_t expect = p->shape()[0] - (p->name == "embed.wte" ? padded_rows : 0);
    EXPECT_EQ(rows[p->name], expect) << p->name;
    rows.erase(p->name);
  }
  EXPECT_TRUE(rows.empty()) << rows.begin()->first << " maps to no parameter";
}

TEST(HfMaps, CoverEveryParameterRowOnce) {
  expect_maps_cover_every_row_once(small_llama(false), 0);
  expect_maps_cover_every_row_once(small_llama(true), 0);
  expect_maps_cover_every_row_once(small_gpt(true), 128 - 40);
  const std::vector<TensorMap> llama = tensor_map(small_llama(false));
  EXPECT_EQ(llama.front().hf_name, "model.embed_tokens.weight");
  EXPECT_EQ(llama.back().hf_name, "lm_head.weight");
  const TensorMap& k = llama[2];
  EXPECT_EQ(k.hf_name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k.param, "blocks.0.body.1.weight");
  EXPECT_EQ(k.row_begin, 16);  // after the 4 query heads of 4
  EXPECT_EQ(tensor_map(small_gpt(false))[2].hf_name, "transformer.h.0.ln_1.weight");
  EXPECT_TRUE(tensor_map(small_gpt(false))[4].transposed);  // c_attn: a Conv1D
}

template <typename M, typename C>
void expect_round_trip(const C& c, DType dtype, std::uint64_t shard) {
  Folder f("round-trip-" + std::string(name_of(dtype)) + std::to_string(shard));
  auto a = random_model<M>(c, 3);
  ExportOptions o;
  o.dtype = dtype;
  if (shard) o.max_shard_bytes = shard;
  save(f.str(), *a, a->state_dict(), o);
  if (shard) EXPECT_TRUE(fs::exists(f.dir / "model.safetensors.index.json"));
  const Config back = read_config(f.str());
  ASSERT_EQ(back.dtype, dtype);
  auto b = std::make_unique<M>(std::get<C>(back.model));
  load_weights(f.str(), *b);
  const StateDict sa = a->state_dict(), sb = b->state_dict();
  for (const auto& [name, t] : sa) {
    if (name.find("rng_") != std::string::npos) continue;
    std::vector<float> want = t.to_floats();
    if (dtype != DType::f32) want = Tensor::from_floats(want, t.shape(), dtype).to_floats();  // rounded once
    const std::vector<float> got = sb.at(name).to_floats();
    if (got.size() == want.size()) {
      EXPECT_EQ(got, want) << name;
    } else {  // a GPT's padded vocabulary: the rows a folder has, then zeros
      ASSERT_GT(want.size(), got.size()) << name;
    }
  }
}

TEST(HfWeights, SaveThenLoadGivesTheSameParameters) {
  expect_round_trip<Llama>(small_llama(false), DType::f32, 0);
  expect_round_trip<Llama>(small_llama(true), DType::bf16, 4000);
  expect_round_trip<Llama>(small_llama(false), DType::f16, 4000);
  expect_round_trip<Gpt>(small_gpt(false), DType::f32, 0);
  expect_round_trip<Gpt>(small_gpt(false), DType::bf16, 3000);
}

TEST(HfWeights, PaddedGptVocabularyExportsItsRealRowsAndLoadsIntoEitherShape) {
  Folder f("padded");
  auto padded = random_model<Gpt>(small_gpt(true), 4);
  save(f.str(), *padded, padded->state_dict());
  const Config c = read_config(f.str());
  EXPECT_EQ(std::get<GptConfig>(c.model).vocab, 40);
  EXPECT_EQ(std::get<GptConfig>(c.model).padded_vocab, 40);  // not padded: see read_config
  const io::SafetensorsFolder folder(f.str());
  EXPECT_EQ(folder.entry("transformer.wte.weight").shape, (Shape{40, 8}));
  // Back into a padded model: the pad rows are zero.
  Gpt again(small_gpt(true));
  load_weights(f.str(), again);
  const std::vector<float> w = again.embed_weight().value.to_floats(), orig = padded->embed_weight().value.to_floats();
  for (std::size_t i = 0; i < w.size(); ++i) EXPECT_EQ(w[i], i < 40 * 8 ? orig[i] : 0.0f) << i;
}

TEST(HfConfig, RoundTripsAndReadsTransformers5sRopeParameters) {
  Folder f("config");
  fs::create_directories(f.dir);
  const LlamaConfig c = small_llama(true);
  { std::ofstream(f.dir / "config.json") << config_json(c, DType::bf16); }
  Config back = read_config(f.str());
  EXPECT_EQ(back.model_type, "llama");
  EXPECT_EQ(std::get<LlamaConfig>(back.model).fingerprint(), c.fingerprint());
  // transformers 5 writes the rotary settings under "rope_parameters".
  nlohmann::json j = nlohmann::json::parse(config_json(c, DType::f32));
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "llama3"},  {"rope_theta", 500000.0},  {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8}};
  j.erase("torch_dtype");
  j["dtype"] = "float32";
  { std::ofstream(f.dir / "config.json") << j.dump(); }
  back = read_config(f.str());
  EXPECT_EQ(std::get<LlamaConfig>(back.model).rope, c.rope);
  EXPECT_EQ(back.dtype, DType::f32);
}

// Writes config.json from `edit`ed JSON of a small Llama.
void write_config(const Folder& f, const std::function<void(nlohmann::json&)>& edit) {
  fs::create_directories(f.dir);
  nlohmann::json j = nlohmann::json::parse(config_json(small_llama(false), DType::f32));
  edit(j);
  std::ofstream(f.dir / "config.json") << j.dump();
}

TEST(HfConfig, UnsupportedOrBrokenConfigsAreRefusedNamingTheKey) {
  Folder f("bad-config");
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    write_config(f, edit);
    expect_invalid_argument([&] { read_config(f.str()); }, needle);
  };
  refused([](nlohmann::json& j) { j["model_type"] = "bert"; }, "model_type \"bert\"");
  refused([](nlohmann::json& j) { j["attention_bias"] = true; }, "\"attention_bias\"");
  refused([](nlohmann::json& j) { j["mlp_bias"] = true; }, "\"mlp_bias\"");
  refused([](nlohmann::json& j) { j["hidden_act"] = "gelu"; }, "\"hidden_act\"");
  refused([](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}}; }, "rope type");
  refused([](nlohmann::json& j) { j.erase("hidden_size"); }, "no \"hidden_size\"");
  refused([](nlohmann::json& j) { j["num_key_value_heads"] = 3; }, "kv_heads must divide");
  refused([](nlohmann::json& j) { j["vocab_size"] = -5; }, "positive integer");
  refused([](nlohmann::json& j) { j["torch_dtype"] = "float64"; }, "float64");
  fs::create_directories(f.dir);
  std::ofstream(f.dir / "config.json") << "{\"model_type\": ";
  expect_invalid_argument([&] { read_config(f.str()); }, "not a JSON object");
  fs::remove(f.dir / "config.json");
  expect_invalid_argument([&] { read_config(f.str()); }, "no readable config.json");
}

// A valid folder of a small untied Llama (f32), for the weight errors below.
struct LlamaFolder : Folder {
  std::unique_ptr<Llama> model;
  LlamaFolder() : Folder("bad-weights"), model(random_model<Llama>(small_llama(false), 5)) {
    save(str(), *model, model->state_dict());
  }
  io::NamedTensors tensors() const {
    const io::SafetensorsFolder folder(str());
    io::NamedTensors out;
    for (const std::string& n : folder.names()) out.emplace_back(n, folder.read(n));
    return out;
  }
  void rewrite(const io::NamedTensors& t) const { io::save_safetensors((dir / "model.safetensors").string(), t); }
};

TEST(HfWeights, BadFoldersAreRefusedNamingTheTensorBeforeLoading) {
  LlamaFolder f;
  const auto refused = [&](const io::NamedTensors& t, const std::string& needle) {
    f.rewrite(t);
    Llama target(small_llama(false));
    target.init(9);
    const std::vector<float> before = target.embed_weight().value.to_floats();
    expect_invalid_argument([&] { load_weights(f.str(), target); }, needle);
    EXPECT_EQ(target.embed_weight().value.to_floats(), before) << "loaded something before refusing: " << needle;
  };
  io::NamedTensors t = f.tensors();
  io::NamedTensors missing(t.begin() + 1, t.end());
  refused(missing, "'" + t.front().first + "' is missing");
  io::NamedTensors extra = t;
  extra.emplace_back("model.layers.7.mlp.gate_proj.weight", Tensor::zeros({2, 2}, DType::f32));
  refused(extra, "'model.layers.7.mlp.gate_proj.weight' belongs to no parameter");
  io::NamedTensors reshaped = t;
  for (auto& [n, v] : reshaped)
    if (n == "model.norm.weight") v = Tensor::zeros({17}, DType::f32);
  refused(reshaped, "'model.norm.weight' has shape [17]");
  io::NamedTensors other_dtype = t;
  for (auto& [n, v] : other_dtype)
    if (n == "model.norm.weight") v = Tensor::zeros({16}, DType::bf16);
  refused(other_dtype, "torch_dtype");
  io::NamedTensors integers = t;
  for (auto& [n, v] : integers)
    if (n == "model.norm.weight") v = Tensor::zeros({16}, DType::i32);
  refused(integers, "F32, BF16 or F16");
  // A model of another shape than the folder's.
  f.rewrite(t);
  LlamaConfig other = small_llama(false);
  other.layers = 3;
  Llama wrong(other);
  expect_invalid_argument([&] { load_weights(f.str(), wrong); }, "build it from hf::read_config");
  // A truncated file: the folder's validation names it.
  std::filesystem::resize_file(f.dir / "model.safetensors", 100);
  Llama target(small_llama(false));
  expect_invalid_argument([&] { load_weights(f.str(), target); }, "model.safetensors");
}

}  // namespace
}  // namespace tutti::models::hf
