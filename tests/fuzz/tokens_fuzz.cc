// Fuzzes data::read_token_shards (llm.c's .bin token shards, GPT-2's uint16 and Llama 3's uint32
// formats). A shard it accepts must give as many tokens as its header says, each inside the
// vocabulary, in its format's width.
#include <cstdlib>
#include <cstring>

#include "fuzz_util.h"
#include "tutti/data/tokens.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tutti;
  const std::string path = fuzz::input_file(data, size, "tokens.bin");
  try {
    const data::TokenCorpus c = data::read_token_shards({path});
    std::int32_t claimed = 0;
    std::memcpy(&claimed, data + 8, 4);  // accepted: the 1024-byte header is there
    if (c.size() != claimed || c.segment_starts != std::vector<std::int64_t>{0}) std::abort();
    std::int32_t magic = 0;
    std::memcpy(&magic, data, 4);
    if (c.tokens.width() != (magic == 20240801 ? 4 : 2)) std::abort();
    for (std::int64_t i = 0; i < c.tokens.size(); ++i) {
      if (c.tokens[i] >= c.vocab) std::abort();
    }
  } catch (const InvalidArgument&) {
  }
  return 0;
}
