// Fuzzes data::read_token_shards (llm.c's .bin token shards). A shard it accepts must give as
// many tokens as its header says, each inside the vocabulary.
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
    for (const auto t : c.tokens) {
      if (t >= c.vocab) std::abort();
    }
  } catch (const InvalidArgument&) {
  }
  return 0;
}
