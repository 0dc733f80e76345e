// Token data: llm.c's .bin shards of both formats (GPT-2's uint16 ids, Llama 3's uint32) read
// back and refused when damaged, bytes of text, the train/validation split, the windows, and the
// TokenLoader's order (the same global batches on every world size, a saved position resuming
// exactly).
#include "tutti/data/tokens.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <unistd.h>

#include "tutti/data/loader.h"

namespace tutti::data {
namespace {

namespace fs = std::filesystem;

// A folder of this process's own, removed at exit.
const fs::path& temp_dir() {
  struct Dir {
    fs::path path = fs::temp_directory_path() / ("tutti_tokens_test_" + std::to_string(::getpid()));
    Dir() { fs::create_directories(path); }
    ~Dir() { fs::remove_all(path); }
  };
  static const Dir dir;
  return dir.path;
}

std::string temp_path(const std::string& name) { return (temp_dir() / name).string(); }

std::vector<std::uint16_t> ramp(std::size_t n, std::uint16_t start) {
  std::vector<std::uint16_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint16_t>((start + i * 7) % 50257);
  return v;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::int32_t header_int(const std::string& bytes, int i) {
  std::int32_t v = 0;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

std::string write_file(const std::string& name, const std::string& content) {
  std::ofstream(temp_path(name), std::ios::binary) << content;
  return temp_path(name);
}

TEST(TokenShards, RoundTripAndSegments) {
  const auto a = ramp(1000, 3), b = ramp(10, 50000);
  write_token_shard(temp_path("a.bin"), a);
  write_token_shard(temp_path("b.bin"), b);
  const TokenCorpus c = read_token_shards({temp_path("a.bin"), temp_path("b.bin")});
  ASSERT_EQ(c.size(), 1010);
  EXPECT_EQ(c.segment_starts, (std::vector<std::int64_t>{0, 1000}));
  EXPECT_EQ(c.vocab, 50257);
  EXPECT_EQ(c.tokens.width(), 2);  // GPT-2's shards stay at 2 bytes a token in memory
  EXPECT_TRUE(std::equal(a.begin(), a.end(), c.tokens.u16().begin()));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), c.tokens.u16().begin() + 1000));
  EXPECT_EQ(c.tokens[1000], b[0]);
}

// An empty shard is an empty segment, first or later. The first one once passed the null data()
// of the empty corpus to memcpy (undefined behaviour: UBSan in the asan preset and the fuzz
// target tests/fuzz/tokens_fuzz.cc report it).
TEST(TokenShards, EmptyShardsAreEmptySegments) {
  write_token_shard(temp_path("empty.bin"), std::vector<std::uint16_t>{});
  write_token_shard(temp_path("three.bin"), std::vector<std::uint16_t>{5, 6, 7});
  const TokenCorpus c = read_token_shards({temp_path("empty.bin"), temp_path("three.bin"), temp_path("empty.bin")});
  EXPECT_EQ(c.tokens.u16(), (std::vector<std::uint16_t>{5, 6, 7}));
  EXPECT_EQ(c.segment_starts, (std::vector<std::int64_t>{0, 0, 3}));
  EXPECT_EQ(read_token_shards({temp_path("empty.bin")}).size(), 0);
}

// The bytes llm.c's dev/data/data_common.py writes: 256 int32 (magic, version, count, zeros),
// then the ids.
TEST(TokenShards, BothFormatsAreLlmcsBytes) {
  write_token_shard(temp_path("g.bin"), std::vector<std::uint16_t>{7, 65535});
  const std::string g = file_bytes(temp_path("g.bin"));
  ASSERT_EQ(g.size(), 1024u + 2 * 2);
  EXPECT_EQ(header_int(g, 0), 20240520);
  EXPECT_EQ(header_int(g, 1), 1);
  EXPECT_EQ(header_int(g, 2), 2);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header_int(g, i), 0);
  EXPECT_EQ(g.substr(1024), std::string("\x07\x00\xff\xff", 4));

  write_token_shard(temp_path("l.bin"), std::vector<std::uint32_t>{7, 128255});
  const std::string l = file_bytes(temp_path("l.bin"));
  ASSERT_EQ(l.size(), 1024u + 2 * 4);
  EXPECT_EQ(header_int(l, 0), 20240801);
  EXPECT_EQ(header_int(l, 1), 7);
  EXPECT_EQ(header_int(l, 2), 2);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header_int(l, i), 0);
  EXPECT_EQ(l.substr(1024), std::string("\x07\x00\x00\x00\xff\xf4\x01\x00", 8));  // 128255 = 0x1f4ff
}

TEST(TokenShards, Uint32ShardsRoundTripWithLlama3sVocabulary) {
  std::vector<std::uint32_t> a(3000), b(5);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::uint32_t>((i * 977) % 128256);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint32_t>(128255 - i);
  write_token_shard(temp_path("la.bin"), a);
  write_token_shard(temp_path("lb.bin"), b);
  const TokenCorpus c = read_token_shards({temp_path("la.bin"), temp_path("lb.bin")});
  ASSERT_EQ(c.size(), 3005);
  EXPECT_EQ(c.tokens.width(), 4);
  EXPECT_EQ(c.vocab, 128256);  // the default for uint32 shards: Llama 3's tokenizer
  EXPECT_EQ(c.segment_starts, (std::vector<std::int64_t>{0, 3000}));
  EXPECT_TRUE(std::equal(a.begin(), a.end(), c.tokens.u32().begin()));
  EXPECT_EQ(c.tokens[3000], 128255u);
  EXPECT_THROW(c.tokens.u16(), InvalidArgument);
  // A vocabulary of one's own: every id below it.
  EXPECT_EQ(read_token_shards({temp_path("la.bin")}, 128256 * 2).vocab, 128256 * 2);

  // The loader serves ids above 65535 as they are; the split keeps the width.
  const auto [train, val] = split_tail(c, 0.5);
  EXPECT_EQ(train.tokens.width(), 4);
  EXPECT_EQ(val.tokens.width(), 4);
  EXPECT_EQ(val.segment_starts, (std::vector<std::int64_t>{0, 1497}));
  TokenLoader l(val, {.sequence_length = 4, .global_micro_batch_size = 1, .shuffle = false});
  const auto last = l.windows_range(l.windows() - 1, l.windows()).targets.to_ints();
  EXPECT_EQ(last.back(), 128251);  // b's last id
  const auto first = l.windows_range(0, 1).inputs.to_ints();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(first[static_cast<std::size_t>(t)], val.tokens[t]);
}

// read_token_shards(paths, vocab) throws InvalidArgument naming the last path and saying each needle.
void expect_refused_saying(const std::vector<std::string>& paths, const std::vector<std::string>& needles,
                           std::int64_t vocab = 0) {
  try {
    read_token_shards(paths, vocab);
    ADD_FAILURE() << "no error for " << paths.back();
  } catch (const InvalidArgument& e) {
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "'" << needle << "' not in " << e.what();
    }
    EXPECT_NE(std::string(e.what()).find(paths.back()), std::string::npos) << e.what();
  }
}

void expect_refused(const std::string& path, const std::string& needle) { expect_refused_saying({path}, {needle}); }

TEST(TokenShards, DamagedFilesAreRefusedNamingTheFile) {
  write_token_shard(temp_path("good.bin"), ramp(100, 0));
  const std::string bytes = file_bytes(temp_path("good.bin"));
  expect_refused(write_file("short.bin", bytes.substr(0, 100)), "header");
  expect_refused(write_file("truncated.bin", bytes.substr(0, bytes.size() - 2)), "truncated");
  std::string magic = bytes;
  magic[0] = 1;
  expect_refused(write_file("magic.bin", magic), "magic");
  std::string version = bytes;
  version[4] = 2;
  expect_refused(write_file("version.bin", version), "version");
  write_token_shard(temp_path("big.bin"), std::vector<std::uint16_t>{1, 2, 60000});
  expect_refused(temp_path("big.bin"), "vocabulary");
  expect_refused(temp_path("missing.bin"), "cannot be read");
}

TEST(TokenShards, ErrorsSayWhatIsWrong) {
  // A header claiming 1000 uint16 ids, followed by 2001 bytes (was: "claims 1000 tokens but
  // holds 1000").
  std::string odd(1024 + 2001, '\0');
  const std::int32_t head[3] = {20240520, 1, 1000};
  std::memcpy(odd.data(), head, sizeof head);
  expect_refused_saying({write_file("odd.bin", odd)},
                        {"GPT-2 format, uint16 ids) claims 1000 ids, 2000 bytes", "2001 bytes follow it, 1 more"});
  expect_refused_saying({write_file("odd_short.bin", odd.substr(0, 1024 + 1999))},
                        {"only 1999 bytes follow it (999 whole ids): truncated"});

  write_token_shard(temp_path("l.bin"), std::vector<std::uint32_t>{5, 70000, 9});
  const std::string l = file_bytes(temp_path("l.bin"));
  expect_refused_saying(
      {write_file("l_cut.bin", l.substr(0, l.size() - 1))},
      {"(llm.c's Llama 3 format, uint32 ids) claims 3 ids", "only 11 bytes follow it (2 whole ids): truncated"});
  std::string l_version = l;
  l_version[4] = 1;  // the GPT-2 format's version with the Llama 3 format's magic
  expect_refused_saying({write_file("l_version.bin", l_version)}, {"Llama 3", "version 1", "that format is version 7"});
  std::string negative = l;
  negative[11] = '\x80';
  expect_refused_saying({write_file("negative.bin", negative)}, {"claims -", "damaged"});

  // Shards of two formats in one corpus: named both.
  write_token_shard(temp_path("g.bin"), std::vector<std::uint16_t>{1, 2, 3});
  expect_refused_saying({temp_path("g.bin"), temp_path("l.bin")}, {"uint32", "uint16", temp_path("g.bin")});

  // Ids outside the vocabulary: the default (Llama 3's) and one given.
  write_token_shard(temp_path("l_big.bin"), std::vector<std::uint32_t>{1, 128256});
  expect_refused_saying({temp_path("l_big.bin")}, {"id 128256 at position 1", "vocabulary of 128256 (Llama 3's"});
  expect_refused_saying({temp_path("l.bin")}, {"id 70000 at position 1", "vocabulary of 1000"}, 1000);
  expect_refused_saying({temp_path("g.bin")}, {"id 3 at position 2", "vocabulary of 3"}, 3);
  EXPECT_THROW(read_token_shards({temp_path("g.bin")}, -1), InvalidArgument);
}

TEST(TokenIds, SliceKeepsTheWidth) {
  const TokenIds a(std::vector<std::uint16_t>{1, 2, 3, 4});
  EXPECT_EQ(a.slice(1, 3).u16(), (std::vector<std::uint16_t>{2, 3}));
  const TokenIds b(std::vector<std::uint32_t>{1, 70000, 3});
  EXPECT_EQ(b.slice(1, 3).u32(), (std::vector<std::uint32_t>{70000, 3}));
  EXPECT_EQ(b.slice(2, 2).size(), 0);
  EXPECT_THROW(b.slice(2, 4), InvalidArgument);
  EXPECT_THROW(b.u16(), InvalidArgument);
  EXPECT_EQ(TokenIds().width(), 2);
}

TEST(TextBytes, EveryByteIsAToken) {
  std::ofstream(temp_path("t1.txt"), std::ios::binary) << "ab\n";
  std::ofstream(temp_path("t2.txt"), std::ios::binary) << std::string("\xff\x00z", 3);
  const TokenCorpus c = read_text_bytes({temp_path("t1.txt"), temp_path("t2.txt")});
  EXPECT_EQ(c.tokens.u16(), (std::vector<std::uint16_t>{'a', 'b', '\n', 255, 0, 'z'}));
  EXPECT_EQ(c.vocab, 256);
  EXPECT_EQ(c.segment_starts, (std::vector<std::int64_t>{0}));
}

TEST(Split, TailIsValidationAndSegmentsFollow) {
  TokenCorpus c;
  c.tokens = ramp(100, 0);
  c.segment_starts = {0, 30, 95};
  const auto [train, val] = split_tail(c, 0.1);
  EXPECT_EQ(train.size(), 90);
  EXPECT_EQ(val.size(), 10);
  EXPECT_EQ(train.segment_starts, (std::vector<std::int64_t>{0, 30}));
  EXPECT_EQ(val.segment_starts, (std::vector<std::int64_t>{0, 5}));
  EXPECT_EQ(val.tokens[0], c.tokens[90]);
}

TEST(TokenLoader, WindowsStayInsideSegmentsAndTargetsAreShiftedInputs) {
  TokenCorpus c;
  c.tokens = ramp(50, 1);
  c.segment_starts = {0, 21};  // 21 tokens: 5 windows of 4 + 1; 29 tokens: 7 windows
  TokenLoader l(c, {.sequence_length = 4, .global_micro_batch_size = 3, .seed = 5, .shuffle = false});
  EXPECT_EQ(l.windows(), 12);
  EXPECT_EQ(l.steps_per_epoch(), 4);
  const TokenBatch b = l.windows_range(4, 6);  // the last window of segment 0, the first of 1
  const std::vector<std::int64_t> x = b.inputs.to_ints(), y = b.targets.to_ints();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(x[static_cast<std::size_t>(t)], c.tokens[static_cast<std::size_t>(16 + t)]);
    EXPECT_EQ(y[static_cast<std::size_t>(t)], c.tokens[static_cast<std::size_t>(17 + t)]);
    EXPECT_EQ(x[static_cast<std::size_t>(4 + t)], c.tokens[static_cast<std::size_t>(21 + t)]);
  }
}

TEST(TokenLoader, EveryWorldSizeSplitsTheSameGlobalBatches) {
  TokenCorpus c;
  c.tokens = ramp(4001, 9);
  for (int world : {1, 2, 3, 4}) {
    const std::int64_t B = 12;
    std::vector<std::int64_t> joined;
    for (int r = 0; r < world; ++r) {
      TokenLoader l(c, {.sequence_length = 8, .global_micro_batch_size = B, .rank = r, .world_size = world, .seed = 3});
      l.set_position({1, 7});
      const TokenBatch b = l.next();
      EXPECT_EQ(b.inputs.dim(0), B / world);
      const auto x = b.inputs.to_ints();
      joined.insert(joined.end(), x.begin(), x.end());
    }
    TokenLoader one(c, {.sequence_length = 8, .global_micro_batch_size = B, .seed = 3});
    EXPECT_EQ(one.batch(1, 7).inputs.to_ints(), joined) << "world " << world;
  }
}

TEST(TokenLoader, EpochVisitsEveryWindowOnceInThePermutationsOrder) {
  TokenCorpus c;
  c.tokens = ramp(801, 2);  // 100 windows of 8 + 1
  TokenLoader l(c, {.sequence_length = 8, .global_micro_batch_size = 10, .seed = 11});
  const std::vector<std::int64_t> order = epoch_permutation(100, 11, 0);
  for (int s = 0; s < 10; ++s) {
    const auto x = l.next().inputs.to_ints();
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(x[static_cast<std::size_t>(i * 8)],
                c.tokens[static_cast<std::size_t>(order[static_cast<std::size_t>(s * 10 + i)] * 8)]);
    }
  }
  EXPECT_EQ(l.next().epoch, 1);
}

TEST(TokenLoader, StateResumesAndRefusesAnotherSetup) {
  TokenCorpus c;
  c.tokens = ramp(2000, 4);
  TokenLoaderOptions o{.sequence_length = 16, .global_micro_batch_size = 8, .seed = 7};
  TokenLoader a(c, o);
  for (int i = 0; i < 20; ++i) a.next();  // into the second epoch
  const StateDict s = a.state_dict();
  TokenLoader b(c, o);
  b.load_state_dict(s);
  EXPECT_EQ(a.position(), b.position());
  EXPECT_EQ(a.next().inputs.to_ints(), b.next().inputs.to_ints());
  TokenLoaderOptions other = o;
  other.seed = 8;
  TokenLoader d(c, other);
  EXPECT_THROW(d.load_state_dict(s), InvalidArgument);
  other = o;
  other.sequence_length = 15;
  TokenLoader e(c, other);
  EXPECT_THROW(e.load_state_dict(s), InvalidArgument);
}

TEST(TokenLoader, BadOptionsAreRefused) {
  TokenCorpus c;
  c.tokens = ramp(100, 0);
  EXPECT_THROW(TokenLoader(c, {.sequence_length = 0, .global_micro_batch_size = 2}), InvalidArgument);
  EXPECT_THROW(TokenLoader(c, {.sequence_length = 10, .global_micro_batch_size = 3, .world_size = 2}), InvalidArgument);
  EXPECT_THROW(TokenLoader(c, {.sequence_length = 10, .global_micro_batch_size = 10}), InvalidArgument);  // 9 windows
}

}  // namespace
}  // namespace tutti::data
