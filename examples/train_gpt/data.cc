#include "data.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace example {

namespace fs = std::filesystem;

std::string fortunes_dir() {
  const char* env = std::getenv("TUTTI_FORTUNES_DIR");
  return env != nullptr && *env != '\0' ? env : "/usr/share/games/fortunes";
}

std::vector<std::string> default_corpus_files() {
  const std::string dir = fortunes_dir();
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    // The cookie files; not fortune's .dat indexes nor the .u8 links to the same files.
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || e.is_symlink() || e.path().has_extension()) continue;
    files.push_back(e.path().string());
  }
  TUTTI_CHECK_ARG(!files.empty(), "the default corpus, Debian's fortunes package, is not in ", dir,
                  ": `apt-get install fortunes` (scripts/setup.sh installs it), set TUTTI_FORTUNES_DIR, or pass "
                  "--data FILE... (any text files, or llm.c .bin token shards)");
  std::sort(files.begin(), files.end());
  return files;
}

namespace {
bool is_shard(const std::string& p) { return p.size() > 4 && p.compare(p.size() - 4, 4, ".bin") == 0; }
}  // namespace

GptData load_gpt_data(const std::vector<std::string>& paths, const std::vector<std::string>& val_paths,
                      double val_fraction) {
  GptData d;
  const std::vector<std::string> files = paths.empty() ? default_corpus_files() : paths;
  const bool shards = is_shard(files.front());
  for (const auto& f : files) {
    TUTTI_CHECK_ARG(is_shard(f) == shards, "--data: mix of .bin token shards and text files (", files.front(), ", ", f,
                    "): give one kind");
  }
  d.bytes = !shards;
  auto read = [&](const std::vector<std::string>& p) {
    return shards ? tutti::data::read_token_shards(p) : tutti::data::read_text_bytes(p);
  };
  tutti::data::TokenCorpus all = read(files);
  const std::string what =
      paths.empty() ? "Debian's fortunes (" + fortunes_dir() + ", " + all.description + ")" : all.description;
  if (!val_paths.empty()) {
    d.train = std::move(all);
    d.val = read(val_paths);
    d.description = what + "; validation: " + d.val.description;
  } else {
    auto [train, val] = tutti::data::split_tail(all, val_fraction);
    d.train = std::move(train);
    d.val = std::move(val);
    d.description =
        what + "; the last " + std::to_string(static_cast<int>(val_fraction * 100 + 0.5)) + "% for validation";
  }
  return d;
}

Detokenizer::Detokenizer(bool bytes, const std::string& tokenizer_path) : bytes_(bytes) {
  if (bytes || tokenizer_path.empty()) return;
  std::ifstream in(tokenizer_path, std::ios::binary);
  TUTTI_CHECK_ARG(in.good(), "--tokenizer ", tokenizer_path, " cannot be read");
  std::uint32_t header[256];
  in.read(reinterpret_cast<char*>(header), sizeof header);
  TUTTI_CHECK_ARG(in.good() && header[0] == 20240328u, "--tokenizer ", tokenizer_path,
                  " is not llm.c's tokenizer file (magic 20240328)");
  pieces_.resize(header[2]);
  for (auto& piece : pieces_) {
    unsigned char n = 0;
    in.read(reinterpret_cast<char*>(&n), 1);
    piece.resize(n);
    in.read(piece.data(), n);
  }
  TUTTI_CHECK_ARG(in.good(), "--tokenizer ", tokenizer_path, " is truncated");
}

std::string Detokenizer::decode(const std::vector<std::int32_t>& tokens) const {
  std::string out;
  for (std::int32_t t : tokens) {
    if (bytes_)
      out.push_back(static_cast<char>(t));
    else if (t >= 0 && static_cast<std::size_t>(t) < pieces_.size())
      out += pieces_[static_cast<std::size_t>(t)];
    else
      out += "<" + std::to_string(t) + ">";
  }
  return out;
}

std::vector<std::int32_t> Detokenizer::bytes_of(const std::string& text) {
  std::vector<std::int32_t> out;
  for (unsigned char c : text) out.push_back(c);
  return out;
}

}  // namespace example
