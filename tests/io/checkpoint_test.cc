// Checkpoints: bit-exact round trips, every kind of damage refused with a clear message, and
// the previous good file surviving failed and interrupted saves.
#include "tutti/io/checkpoint.h"

#include "tutti/data/loader.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "io/checkpoint_file.h"
#include "io/io_test_util.h"

namespace tutti::io {
namespace {

namespace fs = std::filesystem;
using namespace tutti::testing;

void write_file(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

StateDict sample_state(std::uint32_t seed, std::int64_t big_rows = 64) {
  StateDict s;
  s["model.fc1.weight"] = random_bits({big_rows, 37}, DType::f32, seed + 1);
  s["model.fc1.bias"] = random_bits({37}, DType::f16, seed + 2);
  s["model.fc2.weight"] = random_bits({3, 5, 7}, DType::bf16, seed + 3);
  s["optim.step"] = int_scalar_tensor(static_cast<std::int64_t>(seed) * 1000 + 7);
  s["scaler.scale"] = scalar_tensor(65536.0);
  s["loader.epoch"] = random_bits({1}, DType::i64, seed + 4);
  s["rng.state"] = random_bits({13}, DType::i32, seed + 5);
  return s;
}

void expect_same_state(const StateDict& got, const StateDict& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    const auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    EXPECT_TRUE(it->second.device().is_cpu());
    EXPECT_TRUE(same_bits(it->second, t)) << name << ": " << it->second.str() << " vs " << t.str();
  }
}

template <typename E = InvalidArgument, typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "nothing was thrown";
  return "";
}

std::uint32_t le32(const Bytes& b, std::size_t at) {
  return std::uint32_t{b[at]} | std::uint32_t{b[at + 1]} << 8 | std::uint32_t{b[at + 2]} << 16 |
         std::uint32_t{b[at + 3]} << 24;
}
std::uint64_t le64(const Bytes& b, std::size_t at) { return le32(b, at) | std::uint64_t{le32(b, at + 4)} << 32; }

TEST(Checkpoint, RoundTripIsBitExactForEveryDtypeAndShape) {
  TempDir dir;
  const std::vector<Shape> shapes = {{}, {1}, {0}, {3, 0, 2}, {7, 13}, {1000, 37}, {2, 3, 4, 5, 1}};
  StateDict state;
  std::uint32_t seed = 100;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    for (const Shape& shape : shapes) {
      state[std::string(name_of(dtype)) + "." + shape_str(shape)] = random_bits(shape, dtype, seed++);
    }
  }
  const Metadata meta = {{"model", "mlp-784-512-256-10"}, {"empty", ""}, {"binary", std::string("a\0b\xff", 4)}};
  const std::string path = dir.file("ckpt.bin");
  save_checkpoint(path, state, meta);
  const Checkpoint c = load_checkpoint(path);
  expect_same_state(c.state, state);
  EXPECT_EQ(c.metadata, meta);
  // Only the file itself is left: the temporary file was renamed.
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.bin"});
}

TEST(Checkpoint, EmptyStateAndMetadata) {
  TempDir dir;
  save_checkpoint(dir.file("empty"), {});
  const Checkpoint c = load_checkpoint(dir.file("empty"));
  EXPECT_TRUE(c.state.empty());
  EXPECT_TRUE(c.metadata.empty());
}

TEST(Checkpoint, FileFollowsTheDocumentedLayout) {
  TempDir dir;
  const StateDict state = sample_state(1);
  save_checkpoint(dir.file("c"), state, {{"k", "v"}});
  const Bytes b = read_file(dir.file("c"));
  ASSERT_GE(b.size(), 52u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "TUTTICKP");
  EXPECT_EQ(le32(b, 8), kCheckpointFormatVersion);
  EXPECT_EQ(le32(b, 12), 1u);
  EXPECT_EQ(le32(b, 16), state.size());
  const std::uint64_t header_size = le64(b, 24);
  EXPECT_EQ(header_size % 64, 0u);
  EXPECT_EQ(le64(b, 32), b.size());
  // The trailer is zlib's crc32 of everything before it.
  const uLong crc = crc32(0, b.data(), static_cast<uInt>(b.size() - 4));
  EXPECT_EQ(le32(b, b.size() - 4), static_cast<std::uint32_t>(crc));
  // The header crc covers [0, 40) and [48, H).
  uLong hcrc = crc32(0, b.data(), 40);
  hcrc = crc32(hcrc, b.data() + 48, static_cast<uInt>(header_size - 48));
  EXPECT_EQ(le32(b, 40), static_cast<std::uint32_t>(hcrc));
  // The first tensor (in name order: "loader.epoch", i64 [1]) sits at H.
  EXPECT_EQ(std::memcmp(b.data() + header_size, state.at("loader.epoch").data(), 8), 0);
}

TEST(Checkpoint, TruncatedFilesAreRefusedWithTheByteCounts) {
  TempDir dir;
  save_checkpoint(dir.file("good"), sample_state(2));
  const Bytes good = read_file(dir.file("good"));
  for (std::size_t keep : {std::size_t{0}, std::size_t{5}, std::size_t{8}, std::size_t{47}, std::size_t{48},
                           std::size_t{100}, good.size() / 2, good.size() - 4, good.size() - 1}) {
    write_file(dir.file("cut"), Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(keep)));
    const std::string msg = error_message([&] { load_checkpoint(dir.file("cut")); });
    EXPECT_NE(msg.find(dir.file("cut")), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated at byte " + std::to_string(keep)), std::string::npos) << keep << ": " << msg;
    if (keep >= 48) {
      EXPECT_NE(msg.find("of " + std::to_string(good.size())), std::string::npos) << msg;
    }
  }
}

TEST(Checkpoint, EveryFlippedByteIsRefused) {
  TempDir dir;
  StateDict small;
  small["w"] = random_bits({5, 7}, DType::f32, 3);
  small["b"] = random_bits({3}, DType::bf16, 4);
  save_checkpoint(dir.file("good"), small, {{"model", "tiny"}});
  const Bytes good = read_file(dir.file("good"));
  ASSERT_LT(good.size(), 1000u);
  int data_checksum = 0, header_checksum = 0;
  for (std::size_t pos = 0; pos < good.size(); ++pos) {
    Bytes bad = good;
    bad[pos] ^= static_cast<unsigned char>(1u << (pos % 8));
    write_file(dir.file("bad"), bad);
    const std::string msg = error_message([&] { load_checkpoint(dir.file("bad")); });
    ASSERT_FALSE(msg.empty()) << "a flip at byte " << pos << " was accepted";
    // A memory snapshot's holder verifies its bytes without loading them: the same refusal.
    const std::string verified =
        error_message([&] { detail::verify_checkpoint_bytes(bad.data(), bad.size(), dir.file("bad")); });
    ASSERT_FALSE(verified.empty()) << "a flip at byte " << pos << " passed verification";
    ASSERT_EQ(msg.rfind(verified, 0), 0u) << "at byte " << pos << ": " << verified << " / " << msg;
    if (msg.find("header checksum mismatch") != std::string::npos)
      ++header_checksum;
    else if (msg.find("checksum mismatch: stored 0x") != std::string::npos)
      ++data_checksum;
  }
  const io::Checkpoint verified = detail::verify_checkpoint_bytes(good.data(), good.size(), "good");
  EXPECT_EQ(verified.metadata.at("model"), "tiny");
  EXPECT_TRUE(verified.state.empty());
  const std::uint64_t header_size = le64(good, 24);
  // Flips in the data, padding and trailer (and in the fixed header's last reserved word) are
  // caught by the file's crc; flips in the rest of the header by the header's crc, except in
  // the magic, the version and the header-size field, which get messages of their own.
  EXPECT_EQ(data_checksum, static_cast<int>(good.size() - header_size) + 4);
  EXPECT_GE(header_checksum, static_cast<int>(header_size - 48) + 12 + 8 + 4);
}

TEST(Checkpoint, WrongVersionMagicAndMissingFileAreNamed) {
  TempDir dir;
  save_checkpoint(dir.file("good"), sample_state(5));
  Bytes b = read_file(dir.file("good"));
  b[8] = 2;  // format version 2
  write_file(dir.file("v2"), b);
  std::string msg = error_message([&] { load_checkpoint(dir.file("v2")); });
  EXPECT_NE(msg.find("unsupported format version 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir.file("v2")), std::string::npos) << msg;

  write_file(dir.file("text"), Bytes{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '\n'});
  msg = error_message([&] { load_checkpoint(dir.file("text")); });
  EXPECT_NE(msg.find("not a tutti checkpoint"), std::string::npos) << msg;

  msg = error_message([&] { load_checkpoint(dir.file("absent")); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  b = read_file(dir.file("good"));
  b.push_back(0);
  write_file(dir.file("long"), b);
  msg = error_message([&] { load_checkpoint(dir.file("long")); });
  EXPECT_NE(msg.find("trailing bytes"), std::string::npos) << msg;
}

TEST(Checkpoint, BadInputIsRefusedBeforeAnyFileIsTouched) {
  TempDir dir;
  StateDict s = sample_state(6);
  s["undefined"] = Tensor();
  EXPECT_THROW(save_checkpoint(dir.file("c"), s), InvalidArgument);
  StateDict unnamed;
  unnamed[""] = scalar_tensor(1.0);
  EXPECT_THROW(save_checkpoint(dir.file("c"), unnamed), InvalidArgument);
  EXPECT_THROW(save_checkpoint(dir.file("c"), {}, {{"", "x"}}), InvalidArgument);
  EXPECT_TRUE(dir.entries().empty());
  // A directory that does not exist: the C library's error, naming the path.
  const std::string msg = error_message<BackendError>([&] { save_checkpoint(dir.file("no/such/dir/c"), {}); });
  EXPECT_NE(msg.find(dir.file("no/such/dir/c")), std::string::npos) << msg;
}

TEST(Checkpoint, AFailedSaveKeepsThePreviousFile) {
  TempDir dir;
  const std::string path = dir.file("ckpt");
  const StateDict old_state = sample_state(7);
  save_checkpoint(path, old_state, {{"step", "100"}});

  // 1. The temporary file cannot be created (its name is taken by a directory).
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  fs::create_directory(tmp);
  EXPECT_THROW(save_checkpoint(path, sample_state(8)), BackendError);
  fs::remove(tmp);
  expect_same_state(load_checkpoint(path).state, old_state);

  // 2. A write fails halfway (the file size limit is hit: EFBIG), as on a full disk.
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = saved;
  limited.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  const std::string msg = error_message<BackendError>([&] { save_checkpoint(path, sample_state(9, 4096)); });
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find("write"), std::string::npos) << msg;
  EXPECT_NE(msg.find(tmp), std::string::npos) << msg;
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt"});  // the partial file was removed
  const Checkpoint still = load_checkpoint(path);
  expect_same_state(still.state, old_state);
  EXPECT_EQ(still.metadata.at("step"), "100");

  // 3. A truncated temporary file left by a process that was killed is never read, and the
  //    next save goes through and removes it.
  const Bytes good = read_file(path);
  write_file(path + ".tmp.999999", Bytes(good.begin(), good.begin() + 100));
  expect_same_state(load_checkpoint(path).state, old_state);
  const StateDict new_state = sample_state(10);
  save_checkpoint(path, new_state);
  expect_same_state(load_checkpoint(path).state, new_state);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt"});
}

TEST(Checkpoint, TheNextSaveRemovesAKilledSaversTemporaryFile) {
  TempDir dir;
  const std::string path = dir.file("ckpt");
  const StateDict big = sample_state(13, 200000);  // ~30 MB: a save takes a while
  // Files that only look alike stay: another checkpoint's temporary, names that are not
  // "<path>.tmp.<digits>".
  for (const char* other : {"other.tmp.123", "ckpt.tmp.12a", "ckpt.tmp.", "ckpt.bak", "ckpt.tmp.1.x"}) {
    write_file(dir.file(other), Bytes{1, 2, 3});
  }
  // Killed while its temporary file is there (retried in the rare case that the kill falls
  // between one save's rename and the next one's open).
  bool caught = false;
  for (int attempt = 0; attempt < 5 && !caught; ++attempt) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        for (;;) save_checkpoint(path, big);
      } catch (...) {
      }
      _exit(3);  // never return into the test runner
    }
    const std::string child_tmp = path + ".tmp." + std::to_string(child);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!fs::exists(child_tmp) && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child saver ended on its own";
    caught = fs::exists(child_tmp);
  }
  ASSERT_TRUE(caught) << "the child was never caught in the middle of a save";
  // One from a kill long ago, too.
  write_file(path + ".tmp.4194000", Bytes{9});

  const StateDict small = sample_state(14);
  save_checkpoint(path, small);
  expect_same_state(load_checkpoint(path).state, small);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ckpt", "ckpt.bak", "ckpt.tmp.", "ckpt.tmp.1.x", "ckpt.tmp.12a",
                                                     "other.tmp.123"}));
}

TEST(Checkpoint, AKilledSaverLeavesTheOldOrTheNewFile) {
  // A child process saves two alternating states as fast as it can; it is killed at a random
  // moment, several times over. Whatever the moment, the file is one of the two, complete.
  TempDir dir;
  const std::string path = dir.file("ckpt");
  const StateDict a = sample_state(11, 20000);  // ~3 MB
  const StateDict b = sample_state(12, 20000);
  save_checkpoint(path, a);
  std::mt19937 rng(5);
  int saw_a = 0, saw_b = 0;
  for (int round = 0; round < 6; ++round) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        for (int i = 0;; ++i) save_checkpoint(path, i % 2 ? a : b);
      } catch (...) {
      }
      _exit(3);  // never return into the test runner
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 80));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child saver ended on its own";
    const Checkpoint c = load_checkpoint(path);
    if (same_bits(c.state.at("model.fc1.weight"), a.at("model.fc1.weight"))) {
      expect_same_state(c.state, a);
      ++saw_a;
    } else {
      expect_same_state(c.state, b);
      ++saw_b;
    }
    // The killed child's temporary file, if any, is removed by the next child's first save.
  }
  EXPECT_EQ(saw_a + saw_b, 6);
  save_checkpoint(path, a);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt"});
}

TEST(Checkpoint, StateMatchesNamesTheFirstDifference) {
  StateDict here;
  here["model.fc1.weight"] = Tensor::zeros({256, 784}, DType::f32);
  here["model.fc1.bias"] = Tensor::zeros({256}, DType::f32);
  here["optim.fc1.weight.m"] = Tensor::zeros({256, 784}, DType::f32);
  StateDict there = here;
  check_state_matches(there, here, "c.bin");  // identical: no throw

  there["model.fc1.weight"] = Tensor::zeros({512, 784}, DType::f32);
  std::string msg = error_message([&] { check_state_matches(there, here, "c.bin"); });
  EXPECT_NE(msg.find("checkpoint 'c.bin' is for another model: entry 'model.fc1.weight' has shape [512, 784] "
                     "in the checkpoint but [256, 784] here"),
            std::string::npos)
      << msg;
  there = here;
  there["model.fc1.bias"] = Tensor::zeros({256}, DType::bf16);
  msg = error_message([&] { check_state_matches(there, here, "c.bin"); });
  EXPECT_NE(msg.find("'model.fc1.bias' is bf16 in the checkpoint but f32 here"), std::string::npos) << msg;
  there = here;
  there.erase("model.fc1.bias");
  msg = error_message([&] { check_state_matches(there, here, "c.bin"); });
  EXPECT_NE(msg.find("has no entry 'model.fc1.bias'"), std::string::npos) << msg;
  there = here;
  there["model.fc2.weight"] = Tensor::zeros({10, 256}, DType::f32);
  msg = error_message([&] { check_state_matches(there, here, "c.bin"); });
  EXPECT_NE(msg.find("an entry 'model.fc2.weight'"), std::string::npos) << msg;
  // With a prefix, only that part is compared.
  there = here;
  there.erase("optim.fc1.weight.m");
  check_state_matches(there, here, "c.bin", "model.");
  EXPECT_THROW(check_state_matches(there, here, "c.bin", "optim."), InvalidArgument);
}

TEST(Checkpoint, MetadataCheck) {
  Checkpoint c;
  c.metadata["model"] = "mlp-784-512-256-10";
  check_metadata(c, "model", "mlp-784-512-256-10", "c.bin");
  std::string msg = error_message([&] { check_metadata(c, "model", "cnn", "c.bin"); });
  EXPECT_NE(msg.find("model is 'mlp-784-512-256-10' in the checkpoint but 'cnn' here"), std::string::npos) << msg;
  msg = error_message([&] { check_metadata(c, "fingerprint", "x", "c.bin"); });
  EXPECT_NE(msg.find("has no 'fingerprint'"), std::string::npos) << msg;
}

TEST(Checkpoint, PrefixesCombineAndSplitStates) {
  StateDict model, optim, all;
  model["fc1.weight"] = random_bits({4, 3}, DType::f32, 20);
  model["fc1.bias"] = random_bits({4}, DType::f32, 21);
  optim["fc1.weight.m"] = random_bits({4, 3}, DType::f32, 22);
  optim["step"] = int_scalar_tensor(3);
  add_prefixed(all, "model.", model);
  add_prefixed(all, "optim.", optim);
  EXPECT_EQ(all.size(), 4u);
  EXPECT_TRUE(all.at("model.fc1.weight").shares_storage_with(model.at("fc1.weight")));
  EXPECT_THROW(add_prefixed(all, "model.", model), InvalidArgument);
  const StateDict back = strip_prefix(all, "optim.");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(same_bits(back.at("fc1.weight.m"), optim.at("fc1.weight.m")));
  EXPECT_EQ(get_int_scalar(back, "step"), 3);
  EXPECT_TRUE(strip_prefix(all, "scaler.").empty());
}

TEST(Checkpoint, ALoaderPositionResumesThroughAFile) {
  // The resume path of a trainer: loader state into the checkpoint, back out, same batches.
  TempDir dir;
  const Tensor x = random_bits({30, 4}, DType::f32, 30);
  Tensor y = Tensor::empty({30}, DType::i32);
  for (int i = 0; i < 30; ++i) y.data_as<std::int32_t>()[i] = (i * 7) % 10;
  const data::Dataset ds{x, y};
  data::DistributedLoader run(ds, {.global_micro_batch_size = 4, .seed = 5});
  for (int i = 0; i < 10; ++i) run.next();
  StateDict state;
  add_prefixed(state, "loader.", run.state_dict());
  save_checkpoint(dir.file("c"), state);
  data::DistributedLoader resumed(ds, {.global_micro_batch_size = 4, .seed = 5});
  resumed.load_state_dict(strip_prefix(load_checkpoint(dir.file("c")).state, "loader."));
  for (int i = 0; i < 5; ++i) {
    const data::Batch want = run.next();
    const data::Batch got = resumed.next();
    EXPECT_EQ(got.epoch, want.epoch);
    EXPECT_EQ(got.step, want.step);
    EXPECT_TRUE(same_bits(got.images, want.images));
    EXPECT_TRUE(same_bits(got.labels, want.labels));
  }
}

}  // namespace
}  // namespace tutti::io
