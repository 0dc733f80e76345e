#include "tutti/data/tokens.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "tutti/data/loader.h"

namespace tutti::data {
namespace {

constexpr std::int32_t kShardMagic = 20240520;  // llm.c's dev/data/data_common.py
constexpr std::int32_t kShardVersion = 1;       // uint16 tokens
constexpr std::size_t kHeaderInts = 256;

std::vector<char> read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  TUTTI_CHECK_ARG(in.good(), what, " '", path, "' cannot be read (", std::strerror(errno), ")");
  const std::streamsize n = in.tellg();
  std::vector<char> bytes(static_cast<std::size_t>(n));
  in.seekg(0);
  in.read(bytes.data(), n);
  TUTTI_CHECK_ARG(in.good() || n == 0, what, " '", path, "': reading failed after ", in.gcount(), " of ", n, " bytes");
  return bytes;
}

std::string megabytes(std::int64_t bytes) { return detail::str(static_cast<double>(bytes / 10000) / 100.0, " MB"); }

}  // namespace

TokenCorpus read_token_shards(const std::vector<std::string>& paths, std::int64_t vocab) {
  TUTTI_CHECK_ARG(!paths.empty(), "read_token_shards: no file given");
  TokenCorpus c;
  c.vocab = vocab;
  c.segment_starts.clear();
  for (const std::string& path : paths) {
    const std::vector<char> bytes = read_file(path, "token shard");
    const std::size_t header_bytes = kHeaderInts * sizeof(std::int32_t);
    TUTTI_CHECK_ARG(bytes.size() >= header_bytes, "token shard '", path, "' is ", bytes.size(),
                    " bytes, shorter than llm.c's 1024-byte header: not a .bin token shard");
    std::int32_t header[kHeaderInts];
    std::memcpy(header, bytes.data(), header_bytes);
    TUTTI_CHECK_ARG(header[0] == kShardMagic, "token shard '", path, "' has magic ", header[0], ", not llm.c's ",
                    kShardMagic, ": not a .bin token shard");
    TUTTI_CHECK_ARG(header[1] == kShardVersion, "token shard '", path, "' has version ", header[1],
                    "; only version 1 (uint16 tokens, GPT-2's tokenizer) is read");
    const std::int64_t n = header[2];
    TUTTI_CHECK_ARG(n >= 0 && bytes.size() == header_bytes + 2 * static_cast<std::size_t>(n), "token shard '", path,
                    "' claims ", n, " tokens but holds ", (bytes.size() - header_bytes) / 2, ": truncated or damaged");
    c.segment_starts.push_back(c.size());
    const std::size_t at = c.tokens.size();
    c.tokens.resize(at + static_cast<std::size_t>(n));
    std::memcpy(c.tokens.data() + at, bytes.data() + header_bytes, 2 * static_cast<std::size_t>(n));
    for (std::size_t i = at; i < c.tokens.size(); ++i) {
      TUTTI_CHECK_ARG(c.tokens[i] < vocab, "token shard '", path, "': token ", c.tokens[i], " at ", i - at,
                      " is outside the vocabulary of ", vocab);
    }
  }
  c.description = detail::str(paths.size(), " shard(s), ", c.size(), " tokens");
  return c;
}

void write_token_shard(const std::string& path, const std::vector<std::uint16_t>& tokens) {
  std::int32_t header[kHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  TUTTI_CHECK_ARG(tokens.size() <= static_cast<std::size_t>(INT32_MAX), "write_token_shard: too many tokens");
  header[2] = static_cast<std::int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(2 * tokens.size()));
  TUTTI_CHECK_ARG(out.good(), "write_token_shard: writing '", path, "' failed (", std::strerror(errno), ")");
}

TokenCorpus read_text_bytes(const std::vector<std::string>& paths) {
  TUTTI_CHECK_ARG(!paths.empty(), "read_text_bytes: no file given");
  TokenCorpus c;
  c.vocab = 256;
  for (const std::string& path : paths) {
    const std::vector<char> bytes = read_file(path, "text file");
    for (char b : bytes) c.tokens.push_back(static_cast<unsigned char>(b));
  }
  c.description = detail::str(paths.size(), " file(s), ", megabytes(c.size()));
  return c;
}

std::pair<TokenCorpus, TokenCorpus> split_tail(const TokenCorpus& corpus, double fraction) {
  TUTTI_CHECK_ARG(fraction > 0 && fraction < 1, "split_tail: fraction must be in (0, 1), got ", fraction);
  const std::int64_t cut = corpus.size() - static_cast<std::int64_t>(static_cast<double>(corpus.size()) * fraction);
  TokenCorpus train, val;
  train.vocab = val.vocab = corpus.vocab;
  train.tokens.assign(corpus.tokens.begin(), corpus.tokens.begin() + cut);
  val.tokens.assign(corpus.tokens.begin() + cut, corpus.tokens.end());
  train.segment_starts.clear();
  val.segment_starts = {0};
  for (std::int64_t s : corpus.segment_starts) {
    if (s < cut)
      train.segment_starts.push_back(s);
    else if (s > cut)
      val.segment_starts.push_back(s - cut);
  }
  train.description = corpus.description + ", first " + std::to_string(train.size()) + " tokens";
  val.description = corpus.description + ", last " + std::to_string(val.size()) + " tokens";
  return {std::move(train), std::move(val)};
}

TokenLoader::TokenLoader(const TokenCorpus& corpus, TokenLoaderOptions options) : corpus_(corpus), options_(options) {
  const auto& o = options_;
  TUTTI_CHECK_ARG(o.sequence_length >= 1, "TokenLoader: sequence length must be positive, got ", o.sequence_length);
  TUTTI_CHECK_ARG(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "TokenLoader: rank ", o.rank,
                  " is not in [0, world size ", o.world_size, ")");
  TUTTI_CHECK_ARG(o.global_micro_batch_size > 0 && o.global_micro_batch_size % o.world_size == 0,
                  "TokenLoader: global micro-batch size ", o.global_micro_batch_size,
                  " must be positive and divisible by the world size ", o.world_size);
  const std::int64_t T = o.sequence_length;
  for (std::size_t s = 0; s < corpus.segment_starts.size(); ++s) {
    const std::int64_t begin = corpus.segment_starts[s];
    const std::int64_t end = s + 1 < corpus.segment_starts.size() ? corpus.segment_starts[s + 1] : corpus.size();
    for (std::int64_t w = begin; w + T + 1 <= end; w += T) starts_.push_back(w);
  }
  TUTTI_CHECK_ARG(o.global_micro_batch_size <= windows(), "TokenLoader: global micro-batch size ",
                  o.global_micro_batch_size, " is larger than the ", windows(), " windows of ", T + 1,
                  " tokens in the data (", corpus.description, ")");
  steps_per_epoch_ = windows() / o.global_micro_batch_size;
  local_batch_ = o.global_micro_batch_size / o.world_size;
}

TokenBatch TokenLoader::gather(const std::vector<std::int64_t>& windows, std::int64_t epoch, std::int64_t step) const {
  const std::int64_t T = options_.sequence_length, n = static_cast<std::int64_t>(windows.size());
  TokenBatch b{Tensor::empty({n, T}, DType::i32), Tensor::empty({n, T}, DType::i32), epoch, step};
  auto* x = b.inputs.data_as<std::int32_t>();
  auto* y = b.targets.data_as<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t* w = corpus_.tokens.data() + windows[static_cast<std::size_t>(i)];
    for (std::int64_t t = 0; t < T; ++t) {
      x[i * T + t] = w[t];
      y[i * T + t] = w[t + 1];
    }
  }
  return b;
}

TokenBatch TokenLoader::batch(std::int64_t epoch, std::int64_t step) {
  TUTTI_CHECK_ARG(epoch >= 0 && step >= 0 && step < steps_per_epoch_, "TokenLoader: step ", step, " of epoch ", epoch,
                  " does not exist (an epoch has ", steps_per_epoch_, " steps)");
  if (epoch != cached_epoch_) {
    if (options_.shuffle) {
      cached_order_ = epoch_permutation(windows(), options_.seed, epoch);
    } else {
      cached_order_.resize(starts_.size());
      for (std::size_t i = 0; i < cached_order_.size(); ++i) cached_order_[i] = static_cast<std::int64_t>(i);
    }
    cached_epoch_ = epoch;
  }
  const std::int64_t begin = step * options_.global_micro_batch_size + options_.rank * local_batch_;
  std::vector<std::int64_t> w(static_cast<std::size_t>(local_batch_));
  for (std::int64_t i = 0; i < local_batch_; ++i) {
    w[static_cast<std::size_t>(i)] =
        starts_[static_cast<std::size_t>(cached_order_[static_cast<std::size_t>(begin + i)])];
  }
  return gather(w, epoch, step);
}

TokenBatch TokenLoader::next() {
  if (position_.step >= steps_per_epoch_) position_ = {position_.epoch + 1, 0};
  TokenBatch b = batch(position_.epoch, position_.step);
  ++position_.step;
  return b;
}

TokenBatch TokenLoader::windows_range(std::int64_t begin, std::int64_t end) const {
  TUTTI_CHECK_ARG(0 <= begin && begin <= end && end <= windows(), "TokenLoader: windows [", begin, ", ", end,
                  ") are not within the ", windows(), " windows");
  return gather(std::vector<std::int64_t>(starts_.begin() + begin, starts_.begin() + end), 0, 0);
}

void TokenLoader::set_position(Position position) {
  TUTTI_CHECK_ARG(position.epoch >= 0 && position.step >= 0 && position.step <= steps_per_epoch_,
                  "TokenLoader::set_position: epoch ", position.epoch, " step ", position.step, " (an epoch has ",
                  steps_per_epoch_, " steps)");
  position_ = position;
}

StateDict TokenLoader::state_dict() const {
  return {{"epoch", int_scalar_tensor(position_.epoch)},
          {"step", int_scalar_tensor(position_.step)},
          {"seed", int_scalar_tensor(std::bit_cast<std::int64_t>(options_.seed))},
          {"global_micro_batch_size", int_scalar_tensor(options_.global_micro_batch_size)},
          {"sequence_length", int_scalar_tensor(options_.sequence_length)},
          {"windows", int_scalar_tensor(windows())},
          {"shuffle", int_scalar_tensor(options_.shuffle ? 1 : 0)}};
}

void TokenLoader::load_state_dict(const StateDict& state) {
  auto same = [&](const char* key, std::int64_t mine) {
    const std::int64_t saved = get_int_scalar(state, key);
    TUTTI_CHECK_ARG(saved == mine, "cannot resume the data order: it was saved with ", key, " ", saved,
                    ", this run has ", mine);
  };
  same("seed", std::bit_cast<std::int64_t>(options_.seed));
  same("sequence_length", options_.sequence_length);
  same("windows", windows());
  same("shuffle", options_.shuffle ? 1 : 0);
  // Another micro-batch size (accumulation steps that changed with the world size) serves the
  // same windows in the same order: the position is converted on a boundary of the new size.
  const std::int64_t batch = get_int_scalar(state, "global_micro_batch_size");
  const std::int64_t mine = options_.global_micro_batch_size;
  const std::int64_t samples = get_int_scalar(state, "step") * batch;
  TUTTI_CHECK_ARG(batch == mine || samples % mine == 0, "cannot resume the data order: it was saved with ",
                  "global_micro_batch_size ", batch, " at sequence ", samples, " of the epoch, which is not a whole ",
                  "number of this run's micro-batches of ", mine);
  set_position({get_int_scalar(state, "epoch"), samples / mine});
}

}  // namespace tutti::data
