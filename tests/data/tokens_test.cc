// Token data: llm.c's .bin shards read back and refused when damaged, bytes of text, the
// train/validation split, the windows, and the TokenLoader's order (the same global batches on
// every world size, a saved position resuming exactly).
#include "tutti/data/tokens.h"

#include <gtest/gtest.h>

#include <cstdio>
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

TEST(TokenShards, RoundTripAndSegments) {
  const auto a = ramp(1000, 3), b = ramp(10, 50000);
  write_token_shard(temp_path("a.bin"), a);
  write_token_shard(temp_path("b.bin"), b);
  const TokenCorpus c = read_token_shards({temp_path("a.bin"), temp_path("b.bin")});
  ASSERT_EQ(c.size(), 1010);
  EXPECT_EQ(c.segment_starts, (std::vector<std::int64_t>{0, 1000}));
  EXPECT_EQ(c.vocab, 50257);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), c.tokens.begin()));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), c.tokens.begin() + 1000));
}

void expect_refused(const std::string& path, const std::string& needle) {
  try {
    read_token_shards({path});
    ADD_FAILURE() << "no error for " << path;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(TokenShards, DamagedFilesAreRefusedNamingTheFile) {
  write_token_shard(temp_path("good.bin"), ramp(100, 0));
  std::ifstream in(temp_path("good.bin"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(temp_path(name), std::ios::binary) << content;
    return temp_path(name);
  };
  expect_refused(write("short.bin", bytes.substr(0, 100)), "header");
  expect_refused(write("truncated.bin", bytes.substr(0, bytes.size() - 2)), "truncated");
  std::string magic = bytes;
  magic[0] = 1;
  expect_refused(write("magic.bin", magic), "magic");
  std::string version = bytes;
  version[4] = 2;
  expect_refused(write("version.bin", version), "version");
  write_token_shard(temp_path("big.bin"), {1, 2, 60000});
  expect_refused(temp_path("big.bin"), "vocabulary");
  expect_refused(temp_path("missing.bin"), "cannot be read");
}

TEST(TextBytes, EveryByteIsAToken) {
  std::ofstream(temp_path("t1.txt"), std::ios::binary) << "ab\n";
  std::ofstream(temp_path("t2.txt"), std::ios::binary) << std::string("\xff\x00z", 3);
  const TokenCorpus c = read_text_bytes({temp_path("t1.txt"), temp_path("t2.txt")});
  EXPECT_EQ(c.tokens, (std::vector<std::uint16_t>{'a', 'b', '\n', 255, 0, 'z'}));
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
  EXPECT_EQ(val.tokens.front(), c.tokens[90]);
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
