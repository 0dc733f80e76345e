// Reads llm.c token shards with data::read_token_shards and writes out what it read, for the tests
// of scripts/tokenize_text.py (tokenize_test.py: the ids the C++ reader sees are the tokenizer's):
//   dump_tokens [--vocab N] OUT SHARD...
// prints "width W vocab V tokens N segments S0,S1,..." and writes the ids to OUT as
// little-endian uint32. On an error: its message on stderr, exit 1.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tutti/data/tokens.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::int64_t vocab = 0;
  if (args.size() >= 2 && args[0] == "--vocab") {
    vocab = std::stoll(args[1]);
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.size() < 2) {
    std::fprintf(stderr, "usage: dump_tokens [--vocab N] OUT SHARD...\n");
    return 2;
  }
  try {
    const tutti::data::TokenCorpus c =
        tutti::data::read_token_shards(std::vector<std::string>(args.begin() + 1, args.end()), vocab);
    std::vector<std::uint32_t> ids(static_cast<std::size_t>(c.size()));
    for (std::int64_t i = 0; i < c.size(); ++i) ids[static_cast<std::size_t>(i)] = c.tokens[i];
    std::ofstream out(args[0], std::ios::binary);
    out.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(4 * ids.size()));
    if (!out.good()) throw std::runtime_error("cannot write " + args[0]);
    std::string segments;
    for (std::int64_t s : c.segment_starts) segments += (segments.empty() ? "" : ",") + std::to_string(s);
    std::printf("width %d vocab %lld tokens %lld segments %s\n", c.tokens.width(), static_cast<long long>(c.vocab),
                static_cast<long long>(c.size()), segments.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
