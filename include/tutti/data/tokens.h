// Token data for language models: a corpus of token ids in host memory (llm.c's .bin shards,
// or the bytes of text files), cut into windows of T + 1 tokens, and a loader that serves
// each rank its slice of every global batch in an order that depends only on the seed (the
// same training on any number of ranks, as DistributedLoader does for a Dataset).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tutti/core/state_dict.h"
#include "tutti/core/tensor.h"

namespace tutti::data {

// Token ids in the width of their source: 2 bytes each (bytes of text, llm.c's GPT-2 shards) or
// 4 (its Llama 3 shards: vocabularies above 65,536), so that a GPT-2 corpus keeps 2 bytes a
// token in memory. A value type, like the vector it holds.
class TokenIds {
 public:
  TokenIds() = default;  // empty, 2 bytes an id
  // Implicit, so that `corpus.tokens = ids` reads as it did when the member was a vector.
  TokenIds(std::vector<std::uint16_t> ids) : u16_(std::move(ids)) {}
  TokenIds(std::vector<std::uint32_t> ids) : u32_(std::move(ids)), width_(4) {}

  int width() const { return width_; }  // bytes an id: 2 or 4
  std::int64_t size() const { return static_cast<std::int64_t>(width_ == 2 ? u16_.size() : u32_.size()); }
  bool empty() const { return size() == 0; }
  std::uint32_t operator[](std::int64_t i) const {
    return width_ == 2 ? u16_[static_cast<std::size_t>(i)] : u32_[static_cast<std::size_t>(i)];
  }
  // size() * width() bytes (for checksums and files).
  const void* data() const { return width_ == 2 ? static_cast<const void*>(u16_.data()) : u32_.data(); }
  // The ids themselves; throw InvalidArgument when the width is the other one.
  const std::vector<std::uint16_t>& u16() const;
  const std::vector<std::uint32_t>& u32() const;
  // Ids [begin, end), in the same width.
  TokenIds slice(std::int64_t begin, std::int64_t end) const;

 private:
  std::vector<std::uint16_t> u16_;
  std::vector<std::uint32_t> u32_;
  int width_ = 2;
};

// Token ids back to back, in segments (one per shard or file); no window crosses a segment's
// end. vocab: the number of distinct ids the source can hold (256 for bytes; for .bin shards the
// one read_token_shards was given, by default its format's tokenizer's).
struct TokenCorpus {
  TokenIds tokens;
  std::vector<std::int64_t> segment_starts = {0};
  std::int64_t vocab = 256;
  std::string description;  // "3 files, 2.5 MB" ...

  std::int64_t size() const { return tokens.size(); }
};

// llm.c's token shards (its dev/data/data_common.py writes them): a header of 256
// little-endian int32 (a magic, a version, the number of tokens n; the rest 0), then n ids.
// Two formats, told apart by the magic:
//   GPT-2:   magic 20240520, version 1, uint16 ids (2 bytes each);
//   Llama 3: magic 20240801, version 7, uint32 ids (4 bytes each).
// Each file is a segment; the corpus keeps its files' width, and all files must have the same
// one (shards of one corpus come from one tokenizer). vocab: ids must be below it; 0 takes
// the format's tokenizer's: GPT-2's 50257 for uint16 shards, Llama 3's 128256 for uint32 ones.
// Throws InvalidArgument naming the file when it is missing, too short, not such a shard, of
// a size its header does not account for, of another width than the files before it, or holds
// an id >= vocab; BackendError when reading fails or memory runs out.
TokenCorpus read_token_shards(const std::vector<std::string>& paths, std::int64_t vocab = 0);

// Writes `tokens` as one llm.c shard: the GPT-2 format for uint16 ids, the Llama 3 format for
// uint32 ids (for tests and for converting other data; scripts/tokenize.py writes them from
// text).
void write_token_shard(const std::string& path, const std::vector<std::uint16_t>& tokens);
void write_token_shard(const std::string& path, const std::vector<std::uint32_t>& tokens);

// The bytes of the files, in the given order, as one segment of tokens 0..255, 2 bytes each (a
// byte-level language model needs no tokenizer).
TokenCorpus read_text_bytes(const std::vector<std::string>& paths);

// The last `fraction` of the corpus's tokens (at a segment-independent cut) and the rest:
// {train = first 1 - fraction, validation = last fraction}. nanoGPT's split of a text file.
std::pair<TokenCorpus, TokenCorpus> split_tail(const TokenCorpus& corpus, double fraction);

struct TokenLoaderOptions {
  std::int64_t sequence_length = 0;  // T: a window is T + 1 tokens, inputs [0, T), targets [1, T]
  // Sequences one next() serves all ranks together (a micro-batch of every rank). Must divide
  // by world_size and be at most the number of windows.
  std::int64_t global_micro_batch_size = 0;
  int rank = 0;
  int world_size = 1;
  std::uint64_t seed = 0;
  bool shuffle = true;  // false: windows in stored order (validation)
};

// One rank's part of one global micro-batch: fresh CPU tensors [B / world_size, T], i32.
struct TokenBatch {
  Tensor inputs;
  Tensor targets;
  std::int64_t epoch = 0;
  std::int64_t step = 0;
};

// Windows: each segment of the corpus is cut into floor((length - 1) / T) windows starting
// every T tokens (window w covers tokens [s, s + T]: consecutive windows share one token, so
// every token but a segment's first is a target exactly once per epoch). Epoch e visits the
// windows in the order epoch_permutation(windows, seed, e) (loader.h: specified exactly, so a
// peer in another language can reproduce it); global micro-batch s is positions [s·B, (s+1)·B)
// of it and rank r of N takes [r·B/N, (r+1)·B/N); the windows left after the last full
// micro-batch are not used in that epoch. Keeps a reference to the corpus: it must outlive
// the loader. Not thread-safe.
class TokenLoader {
 public:
  TokenLoader(const TokenCorpus& corpus, TokenLoaderOptions options);

  std::int64_t windows() const { return static_cast<std::int64_t>(starts_.size()); }
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  std::int64_t local_micro_batch_size() const { return local_batch_; }
  const TokenLoaderOptions& options() const { return options_; }

  // This rank's slice of global micro-batch `step` of `epoch`; does not move the position.
  TokenBatch batch(std::int64_t epoch, std::int64_t step);
  // batch(position) and advance by one step (to the next epoch after its last step).
  TokenBatch next();
  // Windows [begin, end) in stored order, whole (not sliced by rank): for evaluation, where
  // each rank takes its own range.
  TokenBatch windows_range(std::int64_t begin, std::int64_t end) const;

  struct Position {
    std::int64_t epoch = 0;
    std::int64_t step = 0;
    bool operator==(const Position&) const = default;
  };
  Position position() const { return position_; }
  void set_position(Position position);

  // "epoch", "step", and what the position depends on ("seed", "global_micro_batch_size",
  // "sequence_length", "windows", "shuffle"), i64 scalars; load_state_dict refuses a state
  // saved with different ones (the world size may differ; so may global_micro_batch_size when
  // the position falls on a whole number of this loader's micro-batches: it is converted).
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  TokenBatch gather(const std::vector<std::int64_t>& windows, std::int64_t epoch, std::int64_t step) const;

  const TokenCorpus& corpus_;
  TokenLoaderOptions options_;
  std::vector<std::int64_t> starts_;
  std::int64_t steps_per_epoch_ = 0;
  std::int64_t local_batch_ = 0;
  Position position_;
  std::int64_t cached_epoch_ = -1;
  std::vector<std::int64_t> cached_order_;
};

}  // namespace tutti::data
