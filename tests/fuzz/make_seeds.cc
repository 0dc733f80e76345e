// fuzz_seeds <dir>: writes the seed corpora of the fuzz targets, valid files of each format made
// with tutti's own writers (and IDX files by hand, plain and gzip'ed), into <dir>/<target>/.
// scripts/fuzz.sh runs it after the build, so no binary corpus is kept in the repository.
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tutti/data/tokens.h"
#include "tutti/io/checkpoint.h"
#include "tutti/io/safetensors.h"

namespace {

namespace fs = std::filesystem;
using namespace tutti;

Tensor ramp(Shape shape, DType dtype) {
  const std::int64_t n = numel_of(shape);
  if (dtype == DType::i32 || dtype == DType::i64) {
    std::vector<std::int64_t> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i * 3 - 5;
    return Tensor::from_ints(v, std::move(shape), dtype);
  }
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = 0.25f * static_cast<float>(i) - 1.0f;
  return Tensor::from_floats(v, std::move(shape), dtype);
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void put(const fs::path& p, const std::string& bytes) { fuzz::write_bytes(p.string(), bytes.data(), bytes.size()); }

// An IDX file: big-endian magic 0x0000TTKK, k u32 dimensions, then `body`.
std::string idx(std::uint8_t type, const std::vector<std::uint32_t>& dims, const std::string& body) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((d >> (8 * i)) & 0xFF));
  }
  return s + body;
}

void put_gzip(const fs::path& p, const std::string& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds <dir>\n");
    return 2;
  }
  const fs::path out(argv[1]);
  for (const char* t : {"checkpoint", "idx", "tokens", "safetensors", "safetensors_folder"}) {
    fs::remove_all(out / t);
    fs::create_directories(out / t);
  }

  // Checkpoints: every dtype, a 0-d and an empty tensor, metadata; and an empty one.
  StateDict state = {{"model.w", ramp({3, 4}, DType::f32)},  {"model.h", ramp({5}, DType::f16)},
                     {"model.b", ramp({2, 2}, DType::bf16)}, {"optim.step", ramp({}, DType::i64)},
                     {"loader.ix", ramp({3}, DType::i32)},   {"empty", ramp({0, 2}, DType::f32)}};
  io::save_checkpoint((out / "checkpoint" / "full.tckp").string(), state, {{"model", "mlp"}, {"train.step", "7"}});
  io::save_checkpoint((out / "checkpoint" / "empty.tckp").string(), {});
  io::save_checkpoint((out / "checkpoint" / "one.tckp").string(), {{"x", ramp({1}, DType::f32)}}, {{"k", "v"}});

  // IDX: images and labels (u8), the other element types, plain and gzip'ed.
  put(out / "idx" / "images.idx", idx(0x08, {2, 3, 3}, std::string(18, '\x7f')));
  put(out / "idx" / "labels.idx", idx(0x08, {4}, std::string("\x01\x02\x03\x09", 4)));
  put(out / "idx" / "i16.idx", idx(0x0B, {2, 2}, std::string(8, '\x01')));
  put(out / "idx" / "f32.idx", idx(0x0D, {3}, std::string(12, '\x3f')));
  put(out / "idx" / "f64.idx", idx(0x0E, {1, 1}, std::string(8, '\x40')));
  put(out / "idx" / "empty.idx", idx(0x08, {0, 28, 28}, ""));
  put_gzip(out / "idx" / "images.idx.gz", idx(0x08, {2, 4, 4}, std::string(32, '\x10')));

  // Token shards.
  data::write_token_shard((out / "tokens" / "shard.bin").string(),
                          std::vector<std::uint16_t>{0, 1, 2, 50256, 464, 3290});
  data::write_token_shard((out / "tokens" / "empty.bin").string(), std::vector<std::uint16_t>{});
  // Llama 3's format: uint32 ids (magic 20240801, version 7).
  data::write_token_shard((out / "tokens" / "llama3.bin").string(), std::vector<std::uint32_t>{128000, 9906, 1917, 0});

  // safetensors: every dtype tutti holds, 0-d and empty tensors, metadata; a dtype it does not
  // hold (written by hand); and the empty file.
  const io::NamedTensors tensors = {{"w", ramp({3, 4}, DType::f32)},  {"h", ramp({5}, DType::f16)},
                                    {"b", ramp({2, 2}, DType::bf16)}, {"i", ramp({3}, DType::i32)},
                                    {"step", ramp({}, DType::i64)},   {"none", ramp({0, 3}, DType::f32)}};
  io::save_safetensors((out / "safetensors" / "all.safetensors").string(), tensors, {{"format", "pt"}});
  io::save_safetensors((out / "safetensors" / "empty.safetensors").string(), {});
  const std::string header = R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},)"
                             R"("u":{"dtype":"U8","shape":[2],"data_offsets":[8,10]}})";
  std::string f64(8, '\0');
  f64[0] = static_cast<char>(header.size());
  put(out / "safetensors" / "f64.safetensors", f64 + header + std::string(10, '\x01'));

  // Folders: one file, and an index with its shards (joined as the target splits them).
  const fs::path dir = out / "safetensors_folder" / "tmp";
  io::save_safetensors_folder(dir.string(), tensors, {{"format", "pt"}});
  put(out / "safetensors_folder" / "single", slurp(dir / "model.safetensors"));
  const auto written = io::save_safetensors_folder(dir.string(), tensors, {}, {.max_shard_bytes = 24});
  std::string joined = slurp(dir / written.back());  // the index
  for (std::size_t k = 0; k + 1 < written.size(); ++k)
    joined += std::string(fuzz::kFileSeparator) + slurp(dir / written[k]);
  put(out / "safetensors_folder" / "sharded", joined);
  fs::remove_all(dir);
  return 0;
}
