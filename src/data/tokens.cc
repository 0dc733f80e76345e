#include "tutti/data/tokens.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>

#include "tutti/data/loader.h"

namespace tutti::data {
namespace {

// Shards are little-endian, as is every host tutti builds for; the ids are read as they lie.
static_assert(std::endian::native == std::endian::little, "token shards are read as little-endian");

constexpr std::size_t kHeaderInts = 256;
constexpr std::size_t kHeaderBytes = kHeaderInts * sizeof(std::int32_t);

// llm.c's two shard formats (dev/data/data_common.py, HEADERS_INFO).
struct ShardFormat {
  const char* name;
  std::int32_t magic;
  std::int32_t version;
  int width;           // bytes an id
  const char* type;    // the ids' type
  std::int64_t vocab;  // its tokenizer's vocabulary: the default bound on the ids
};
constexpr ShardFormat kGpt2{"GPT-2", 20240520, 1, 2, "uint16", 50257};
constexpr ShardFormat kLlama3{"Llama 3", 20240801, 7, 4, "uint32", 128256};

std::string format_str(const ShardFormat& f) { return detail::str("llm.c's ", f.name, " format (", f.type, " ids)"); }

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

// A shard's header, checked against the file's size: which format, how many ids.
struct ShardHeader {
  const ShardFormat* format;
  std::int64_t count;
};

ShardHeader read_header(std::ifstream& in, const std::string& path) {
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::int64_t>(in.tellg());
  in.seekg(0);
  TUTTI_CHECK_ARG(size >= 0 && in.good(), "token shard '", path, "' cannot be read (not a regular file?)");
  TUTTI_CHECK_ARG(size >= static_cast<std::int64_t>(kHeaderBytes), "token shard '", path, "' is ", size,
                  " bytes, shorter than llm.c's 1024-byte header: not a .bin token shard");
  std::int32_t header[kHeaderInts];
  in.read(reinterpret_cast<char*>(header), kHeaderBytes);
  if (!in.good()) TUTTI_THROW(BackendError, "reading token shard '", path, "' failed: ", std::strerror(errno));
  const ShardFormat* f = header[0] == kGpt2.magic ? &kGpt2 : header[0] == kLlama3.magic ? &kLlama3 : nullptr;
  TUTTI_CHECK_ARG(f != nullptr, "token shard '", path, "' has magic ", header[0], ", neither llm.c's ", kGpt2.magic,
                  " (", kGpt2.name, ", ", kGpt2.type, " ids) nor its ", kLlama3.magic, " (", kLlama3.name, ", ",
                  kLlama3.type, " ids): not a .bin token shard");
  TUTTI_CHECK_ARG(header[1] == f->version, "token shard '", path, "' has the magic of ", format_str(*f), ", ", f->magic,
                  ", but version ", header[1], "; that format is version ", f->version);
  const std::int64_t n = header[2], follow = size - static_cast<std::int64_t>(kHeaderBytes);
  TUTTI_CHECK_ARG(n >= 0, "token shard '", path, "' claims ", n, " ids: damaged");
  const std::int64_t expected = n * f->width;
  TUTTI_CHECK_ARG(follow >= expected, "token shard '", path, "' (llm.c's ", f->name, " format, ", f->type,
                  " ids) claims ", n, " ids, ", expected, " bytes after its 1024-byte header, but only ", follow,
                  " bytes follow it (", follow / f->width, " whole ids): truncated");
  TUTTI_CHECK_ARG(follow == expected, "token shard '", path, "' (llm.c's ", f->name, " format, ", f->type,
                  " ids) claims ", n, " ids, ", expected, " bytes after its 1024-byte header, but ", follow,
                  " bytes follow it, ", follow - expected, " more: damaged, or not one shard as llm.c writes it");
  return {f, n};
}

// Appends the shard's `count` ids to `ids` (read in place: no second copy of the file).
template <class Id>
void read_ids(std::ifstream& in, const std::string& path, std::int64_t count, std::vector<Id>& ids) {
  const std::size_t at = ids.size();
  try {
    ids.resize(at + static_cast<std::size_t>(count));
  } catch (const std::bad_alloc&) {
    TUTTI_THROW(BackendError, "out of host memory reading token shard '", path, "': ", count, " ids of ", sizeof(Id),
                " bytes after the ", at, " read before it");
  }
  // Not for an empty shard: reading into the null data() of an empty vector is undefined (UBSan,
  // through the fuzz target tests/fuzz/tokens_fuzz.cc).
  if (count > 0) in.read(reinterpret_cast<char*>(ids.data() + at), static_cast<std::streamsize>(count * sizeof(Id)));
  if (!in.good() && count > 0) {
    TUTTI_THROW(BackendError, "reading token shard '", path, "' failed after ", in.gcount(), " of ",
                count * static_cast<std::int64_t>(sizeof(Id)), " bytes: ", std::strerror(errno));
  }
}

// Throws naming the file and the first id >= vocab among ids [begin, end).
template <class Id>
void check_vocab(const std::vector<Id>& ids, std::size_t begin, const std::string& path, std::int64_t vocab,
                 const char* whose) {
  if (begin == ids.size()) return;
  const Id most = *std::max_element(ids.begin() + static_cast<std::ptrdiff_t>(begin), ids.end());
  if (static_cast<std::int64_t>(most) < vocab) return;
  for (std::size_t i = begin; i < ids.size(); ++i) {
    TUTTI_CHECK_ARG(static_cast<std::int64_t>(ids[i]) < vocab, "token shard '", path, "': id ", ids[i], " at position ",
                    i - begin, " is outside the vocabulary of ", vocab, whose);
  }
}

template <class Id>
void write_shard(const std::string& path, const ShardFormat& f, const std::vector<Id>& tokens) {
  static_assert(sizeof(Id) == 2 || sizeof(Id) == 4);
  TUTTI_CHECK_ARG(tokens.size() <= static_cast<std::size_t>(INT32_MAX), "write_token_shard: ", tokens.size(),
                  " ids do not fit llm.c's header (at most 2^31 - 1 a shard)");
  std::int32_t header[kHeaderInts] = {};
  header[0] = f.magic;
  header[1] = f.version;
  header[2] = static_cast<std::int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TUTTI_CHECK_ARG(out.good(), "write_token_shard: '", path, "' cannot be written (", std::strerror(errno), ")");
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(sizeof(Id) * tokens.size()));
  out.close();
  if (out.fail()) TUTTI_THROW(BackendError, "write_token_shard: writing '", path, "' failed: ", std::strerror(errno));
}

}  // namespace

const std::vector<std::uint16_t>& TokenIds::u16() const {
  TUTTI_CHECK_ARG(width_ == 2, "TokenIds::u16(): the ids are ", width_, " bytes each: use u32()");
  return u16_;
}

const std::vector<std::uint32_t>& TokenIds::u32() const {
  TUTTI_CHECK_ARG(width_ == 4, "TokenIds::u32(): the ids are ", width_, " bytes each: use u16()");
  return u32_;
}

TokenIds TokenIds::slice(std::int64_t begin, std::int64_t end) const {
  TUTTI_CHECK_ARG(0 <= begin && begin <= end && end <= size(), "TokenIds::slice: [", begin, ", ", end,
                  ") is not within the ", size(), " ids");
  auto part = [&](const auto& v) { return std::vector(v.begin() + begin, v.begin() + end); };
  if (width_ == 2) return TokenIds(part(u16_));
  return TokenIds(part(u32_));
}

TokenCorpus read_token_shards(const std::vector<std::string>& paths, std::int64_t vocab) {
  TUTTI_CHECK_ARG(!paths.empty(), "read_token_shards: no file given");
  TUTTI_CHECK_ARG(vocab >= 0 && vocab <= std::int64_t{1} << 31, "read_token_shards: vocab ", vocab,
                  " is not in [1, 2^31] (0: the format's tokenizer's)");
  TokenCorpus c;
  c.segment_starts.clear();
  std::vector<std::uint16_t> u16;
  std::vector<std::uint32_t> u32;
  const ShardFormat* format = nullptr;
  std::string first;  // the file that set the format
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    TUTTI_CHECK_ARG(in.good(), "token shard '", path, "' cannot be read (", std::strerror(errno), ")");
    const ShardHeader h = read_header(in, path);
    if (format == nullptr) {
      format = h.format;
      first = path;
      c.vocab = vocab != 0 ? vocab : format->vocab;
    }
    TUTTI_CHECK_ARG(h.format == format, "token shard '", path, "' is in ", format_str(*h.format), " but '", first,
                    "' is in ", format_str(*format), ": the shards of one corpus come from one tokenizer");
    const char* whose = vocab != 0         ? ""
                        : format == &kGpt2 ? " (GPT-2's, the default for uint16 shards)"
                                           : " (Llama 3's, the default for uint32 shards)";
    c.segment_starts.push_back(static_cast<std::int64_t>(u16.size() + u32.size()));
    if (format->width == 2) {
      const std::size_t at = u16.size();
      read_ids(in, path, h.count, u16);
      check_vocab(u16, at, path, c.vocab, whose);
    } else {
      const std::size_t at = u32.size();
      read_ids(in, path, h.count, u32);
      check_vocab(u32, at, path, c.vocab, whose);
    }
  }
  if (format->width == 2)
    c.tokens = TokenIds(std::move(u16));
  else
    c.tokens = TokenIds(std::move(u32));
  c.description = detail::str(paths.size(), " shard(s), ", c.size(), " tokens");
  if (format->width == 4) c.description += " (uint32)";
  return c;
}

void write_token_shard(const std::string& path, const std::vector<std::uint16_t>& tokens) {
  write_shard(path, kGpt2, tokens);
}

void write_token_shard(const std::string& path, const std::vector<std::uint32_t>& tokens) {
  write_shard(path, kLlama3, tokens);
}

TokenCorpus read_text_bytes(const std::vector<std::string>& paths) {
  TUTTI_CHECK_ARG(!paths.empty(), "read_text_bytes: no file given");
  TokenCorpus c;
  c.vocab = 256;
  std::vector<std::uint16_t> ids;
  for (const std::string& path : paths) {
    const std::vector<char> bytes = read_file(path, "text file");
    for (char b : bytes) ids.push_back(static_cast<unsigned char>(b));
  }
  c.tokens = std::move(ids);
  c.description = detail::str(paths.size(), " file(s), ", megabytes(c.size()));
  return c;
}

std::pair<TokenCorpus, TokenCorpus> split_tail(const TokenCorpus& corpus, double fraction) {
  TUTTI_CHECK_ARG(fraction > 0 && fraction < 1, "split_tail: fraction must be in (0, 1), got ", fraction);
  const std::int64_t cut = corpus.size() - static_cast<std::int64_t>(static_cast<double>(corpus.size()) * fraction);
  TokenCorpus train, val;
  train.vocab = val.vocab = corpus.vocab;
  train.tokens = corpus.tokens.slice(0, cut);
  val.tokens = corpus.tokens.slice(cut, corpus.size());
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
  auto copy = [&](const auto* ids) {  // ids below 2^31 (read_token_shards' vocab): they fit i32
    for (std::int64_t i = 0; i < n; ++i) {
      const auto* w = ids + windows[static_cast<std::size_t>(i)];
      for (std::int64_t t = 0; t < T; ++t) {
        x[i * T + t] = static_cast<std::int32_t>(w[t]);
        y[i * T + t] = static_cast<std::int32_t>(w[t + 1]);
      }
    }
  };
  if (corpus_.tokens.width() == 2)
    copy(corpus_.tokens.u16().data());
  else
    copy(corpus_.tokens.u32().data());
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
