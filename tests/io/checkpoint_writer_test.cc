// CheckpointWriter: the async file is save_checkpoint's, byte for byte; save() takes a snapshot;
// at most one write is in flight under both busy policies; a failed background write is thrown
// by the next call; the destructor completes a write in flight. Slow writes are made with the
// before_write hook blocking on a gate that the test opens, so no assertion depends on timing.
#include "tutti/io/checkpoint_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <random>
#include <thread>

#include "io/io_test_util.h"

namespace tutti::io {
namespace {

namespace fs = std::filesystem;
using namespace tutti::testing;

StateDict sample_state(std::uint32_t seed) {
  StateDict s;
  s["model.fc1.weight"] = random_bits({300, 37}, DType::f32, seed + 1);
  s["model.fc1.bias"] = random_bits({37}, DType::f16, seed + 2);
  s["model.fc2.weight"] = random_bits({3, 5, 7}, DType::bf16, seed + 3);
  s["model.empty"] = random_bits({3, 0}, DType::f32, seed + 4);
  s["optim.step"] = int_scalar_tensor(static_cast<std::int64_t>(seed) * 1000 + 7);
  s["scaler.scale"] = scalar_tensor(65536.0);
  s["rng.state"] = random_bits({13}, DType::i32, seed + 5);
  return s;
}

StateDict deep_copy(const StateDict& s) {
  StateDict out;
  for (const auto& [name, t] : s) out[name] = t.clone();
  return out;
}

// Overwrites every byte of every tensor (the caller's next training step).
void scribble(StateDict& s) {
  for (auto& [name, t] : s) std::memset(t.data(), 0x5A, t.nbytes());
}

void expect_file_holds(const std::string& path, const StateDict& want) {
  const Checkpoint c = load_checkpoint(path);
  ASSERT_EQ(c.state.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_EQ(c.state.count(name), 1u) << name;
    EXPECT_TRUE(same_bits(c.state.at(name), t)) << name;
  }
}

// A gate the writer's hook blocks on until the test opens it. Shared, so that a hook still
// returning from wait() never touches a destroyed object.
struct Gate {
  std::promise<void> promise;
  std::shared_future<void> future = promise.get_future().share();
  std::atomic<bool> is_open{false};
  void open() {
    if (!is_open.exchange(true)) promise.set_value();
  }
  void wait() const { future.wait(); }
};
// Opens the gate when the test leaves its scope (also on a failed assertion), so that the
// writer's destructor, which waits for the write, cannot hang.
struct OpenOnExit {
  std::shared_ptr<Gate> gate;
  ~OpenOnExit() { gate->open(); }
};

const Metadata kMeta = {{"model", "mlp-784-512-256-10"}, {"binary", std::string("a\0b\xff", 4)}};

TEST(CheckpointWriter, AsyncAndSyncFilesAreSaveCheckpointsByteForByte) {
  TempDir dir;
  StateDict state = sample_state(1);
  save_checkpoint(dir.file("reference"), state, kMeta);
  CheckpointWriter sync_writer({.mode = CheckpointMode::sync});
  const SaveResult rs = sync_writer.save(dir.file("sync"), 10, state, kMeta);
  EXPECT_TRUE(rs.started);
  EXPECT_FALSE(rs.skipped);
  EXPECT_EQ(sync_writer.last_written_step(), 10);  // written when save returns
  CheckpointWriter async_writer({.mode = CheckpointMode::async});
  const SaveResult ra = async_writer.save(dir.file("async"), 10, state, kMeta);
  EXPECT_TRUE(ra.started);
  EXPECT_EQ(ra.busy_step, -1);
  EXPECT_EQ(ra.write_s, 0.0);
  async_writer.finish();
  EXPECT_EQ(async_writer.last_written_step(), 10);
  const Bytes reference = read_file(dir.file("reference"));
  ASSERT_FALSE(reference.empty());
  EXPECT_EQ(ra.file_bytes, reference.size());
  EXPECT_EQ(read_file(dir.file("sync")), reference);
  EXPECT_EQ(read_file(dir.file("async")), reference);
  expect_file_holds(dir.file("async"), state);
  EXPECT_EQ(load_checkpoint(dir.file("async")).metadata, kMeta);

  // A second save reuses the buffers (same size) and writes the new values.
  const std::uint64_t buffer = async_writer.buffer_bytes();
  EXPECT_GE(buffer, reference.size() - 4096);
  StateDict next = sample_state(2);
  async_writer.save(dir.file("async"), 20, next, kMeta);
  async_writer.finish();
  EXPECT_EQ(async_writer.buffer_bytes(), buffer);
  save_checkpoint(dir.file("reference"), next, kMeta);
  EXPECT_EQ(read_file(dir.file("async")), read_file(dir.file("reference")));
}

TEST(CheckpointWriter, GpuTensorsAreCopiedToHostBuffers) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU visible: device-to-host snapshot not exercised";
  TempDir dir;
  const StateDict host = sample_state(3);
  StateDict on_device;
  for (const auto& [name, t] : host) on_device[name] = t.to(Device::cuda());
  Stream stream = Stream::create(Device::cuda());
  CheckpointWriter writer;
  const SaveResult r = writer.save(dir.file("gpu"), 5, on_device, kMeta, stream);
  EXPECT_TRUE(r.started);
  // Snapshot semantics on the device too: zero the sources once save() returned.
  for (auto& [name, t] : on_device) t.zero(stream);
  stream.synchronize();
  writer.finish();
  save_checkpoint(dir.file("reference"), host, kMeta);
  EXPECT_EQ(read_file(dir.file("gpu")), read_file(dir.file("reference")));
}

TEST(CheckpointWriter, SaveTakesASnapshot) {
  // The write is held until the sources have been overwritten: the file must still hold the
  // values of the save() call. (Writing from the caller's tensors instead of the snapshot
  // buffers makes this fail.)
  TempDir dir;
  auto gate = std::make_shared<Gate>();
  CheckpointWriter writer({.hooks = {.before_write = [gate](std::int64_t, const std::string&) { gate->wait(); }}});
  OpenOnExit guard{gate};
  StateDict state = sample_state(4);
  const StateDict original = deep_copy(state);
  writer.save(dir.file("snap"), 1, state, kMeta);
  EXPECT_TRUE(writer.busy());
  scribble(state);
  gate->open();
  writer.finish();
  expect_file_holds(dir.file("snap"), original);
}

TEST(CheckpointWriter, HandedOverTensorsAreWrittenInPlaceAndKeptUntilWritten) {
  // save_handing_over(state, handed): the file is save() of both; the handed tensors take no
  // buffer, and the writer holds them (not a copy) until their write ends, then frees them.
  TempDir dir;
  const StateDict all = sample_state(9);
  save_checkpoint(dir.file("reference"), all, kMeta);
  StateDict state, handed;
  std::int64_t handed_bytes = 0;
  for (const auto& [name, t] : all) {
    if (name.rfind("model.", 0) == 0) {
      handed[name] = t.clone();  // made for the save: nothing else refers to it
      handed_bytes += static_cast<std::int64_t>(t.nbytes());
    } else {
      state[name] = t;
    }
  }
  ASSERT_GT(handed_bytes, 0);
  ASSERT_FALSE(state.empty());

  auto gate = std::make_shared<Gate>();
  CheckpointWriter writer({.hooks = {.before_write = [gate](std::int64_t, const std::string&) { gate->wait(); }}});
  OpenOnExit guard{gate};
  const SaveResult r = writer.save_handing_over(dir.file("handed"), 3, state, std::move(handed), kMeta);
  EXPECT_TRUE(r.started);
  EXPECT_TRUE(writer.busy());
  // Only `state` was copied into buffers: they are smaller than the file by the handed bytes.
  EXPECT_LE(writer.buffer_bytes() + static_cast<std::uint64_t>(handed_bytes), r.file_bytes);
  const std::int64_t while_writing = Storage::live_bytes(Device::cpu());
  gate->open();
  writer.finish();
  EXPECT_EQ(while_writing - Storage::live_bytes(Device::cpu()), handed_bytes)
      << "the writer held the handed tensors until their write ended, and no longer";
  EXPECT_EQ(read_file(dir.file("handed")), read_file(dir.file("reference")));

  // A key in both is refused before anything starts.
  StateDict twice;
  twice["optim.step"] = int_scalar_tensor(1);
  EXPECT_THROW(writer.save_handing_over(dir.file("twice"), 4, state, twice, kMeta), InvalidArgument);
  EXPECT_FALSE(fs::exists(dir.file("twice")));
}

TEST(CheckpointWriter, WaitPolicyWaitsForTheWriteInFlight) {
  TempDir dir;
  auto gate = std::make_shared<Gate>();
  std::atomic<int> writing{0}, most_at_once{0};
  std::vector<std::int64_t> completed_when_begun;  // last_written_step() as each write begins
  CheckpointWriter* self = nullptr;
  CheckpointWriterOptions options;
  options.when_busy = WhenBusy::wait;
  options.hooks.before_write = [&, gate](std::int64_t step, const std::string&) {
    most_at_once = std::max(most_at_once.load(), ++writing);
    completed_when_begun.push_back(self->last_written_step());
    if (step == 1) gate->wait();
    --writing;
  };
  std::vector<std::int64_t> waited_for;
  // The second save opens the gate itself, once it has found the first write in flight.
  options.hooks.before_wait = [&, gate](std::int64_t busy_step) {
    waited_for.push_back(busy_step);
    gate->open();
  };
  CheckpointWriter writer(options);
  self = &writer;
  OpenOnExit guard{gate};
  const StateDict first = sample_state(5), second = sample_state(6);
  EXPECT_TRUE(writer.save(dir.file("one"), 1, first, kMeta).started);
  const SaveResult r = writer.save(dir.file("two"), 2, second, kMeta);
  EXPECT_TRUE(r.started);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.busy_step, 1);
  EXPECT_EQ(waited_for, std::vector<std::int64_t>{1});
  writer.finish();
  EXPECT_EQ(most_at_once.load(), 1);
  // Write 2 began after write 1 had completed.
  EXPECT_EQ(completed_when_begun, (std::vector<std::int64_t>{-1, 1}));
  expect_file_holds(dir.file("one"), first);
  expect_file_holds(dir.file("two"), second);
  EXPECT_EQ(writer.last_written_step(), 2);
}

TEST(CheckpointWriter, SkipPolicySkipsWithoutTouchingTheWriteInFlight) {
  TempDir dir;
  auto gate = std::make_shared<Gate>();
  CheckpointWriterOptions options;
  options.when_busy = WhenBusy::skip;
  options.hooks.before_write = [gate](std::int64_t, const std::string&) { gate->wait(); };
  options.hooks.before_wait = [gate](std::int64_t) {
    ADD_FAILURE() << "a skipping writer waited";
    gate->open();  // fail, not hang
  };
  CheckpointWriter writer(options);
  OpenOnExit guard{gate};
  const StateDict first = sample_state(7);
  const StateDict second = sample_state(8);
  EXPECT_TRUE(writer.save(dir.file("ckpt"), 1, first, kMeta).started);
  const SaveResult r = writer.save(dir.file("ckpt"), 2, second, kMeta);
  EXPECT_TRUE(r.skipped);
  EXPECT_FALSE(r.started);
  EXPECT_EQ(r.busy_step, 1);
  EXPECT_EQ(r.copy_s, 0.0);
  gate->open();
  writer.finish();
  // The file is the first snapshot, whole: the skipped save copied nothing over its buffers.
  expect_file_holds(dir.file("ckpt"), first);
  EXPECT_EQ(writer.last_written_step(), 1);
  // Idle again: the next save is taken.
  EXPECT_TRUE(writer.save(dir.file("ckpt"), 3, second, kMeta).started);
  writer.finish();
  expect_file_holds(dir.file("ckpt"), second);
}

template <typename F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a tutti::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "nothing was thrown";
  return "";
}

TEST(CheckpointWriter, FailedBackgroundWriteIsThrownByTheNextCall) {
  TempDir dir;
  { std::ofstream(dir.file("a_file")) << "x"; }
  const std::string bad = dir.file("a_file") + "/ckpt";  // under a regular file: ENOTDIR
  CheckpointWriter writer;
  const SaveResult r = writer.save(bad, 7, sample_state(9), kMeta);
  EXPECT_TRUE(r.started);  // the failure comes later, on the writer's thread
  while (writer.busy()) std::this_thread::yield();
  const std::string message = thrown([&] { writer.check(); });
  EXPECT_NE(message.find(bad), std::string::npos) << message;
  EXPECT_NE(message.find("step 7"), std::string::npos) << message;
  EXPECT_NE(message.find(std::strerror(ENOTDIR)), std::string::npos) << message;
  EXPECT_THROW(writer.check(), BackendError);
  // It stays: every later call throws it, a save to a good path included, which writes nothing.
  EXPECT_EQ(thrown([&] { writer.finish(); }), message);
  EXPECT_EQ(thrown([&] { writer.save(dir.file("good"), 8, sample_state(9), kMeta); }), message);
  EXPECT_FALSE(fs::exists(dir.file("good")));
}

TEST(CheckpointWriter, FailureOfTheHookIsTheWritesFailure) {
  TempDir dir;
  CheckpointWriterOptions options;
  options.hooks.before_write = [](std::int64_t, const std::string&) { throw std::runtime_error("disk pulled"); };
  CheckpointWriter writer(options);
  writer.save(dir.file("ckpt"), 3, sample_state(10));
  const std::string message = thrown([&] { writer.finish(); });
  EXPECT_NE(message.find("disk pulled"), std::string::npos) << message;
  EXPECT_NE(message.find("step 3"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(dir.file("ckpt")));
}

TEST(CheckpointWriter, SyncModeThrowsFromSave) {
  TempDir dir;
  { std::ofstream(dir.file("a_file")) << "x"; }
  CheckpointWriter writer({.mode = CheckpointMode::sync});
  EXPECT_THROW(writer.save(dir.file("a_file") + "/ckpt", 1, sample_state(11)), BackendError);
  // Thrown once, from the call itself: the writer goes on.
  writer.check();
  EXPECT_TRUE(writer.save(dir.file("ckpt"), 2, sample_state(11)).started);
  expect_file_holds(dir.file("ckpt"), sample_state(11));
}

TEST(CheckpointWriter, BadEntriesAreRefusedBeforeAnythingStarts) {
  TempDir dir;
  CheckpointWriter writer;
  StateDict state = sample_state(12);
  state["undefined"] = Tensor();
  const std::string message = thrown([&] { writer.save(dir.file("ckpt"), 1, state); });
  EXPECT_NE(message.find("'undefined' is an undefined tensor"), std::string::npos) << message;
  EXPECT_FALSE(writer.busy());
  EXPECT_EQ(writer.buffer_bytes(), 0u);
  EXPECT_THROW(writer.save("", 1, sample_state(12)), InvalidArgument);
  writer.finish();  // nothing failed in the background
  EXPECT_FALSE(fs::exists(dir.file("ckpt")));
}

TEST(CheckpointWriter, DestructorCompletesTheWriteInFlight) {
  // The write is still held when the writer goes (the hook sleeps); a destructor that
  // abandoned it would leave no file.
  TempDir dir;
  const StateDict state = sample_state(13);
  {
    CheckpointWriter writer({.hooks = {.before_write = [](std::int64_t, const std::string&) {
                               std::this_thread::sleep_for(std::chrono::milliseconds(200));
                             }}});
    writer.save(dir.file("ckpt"), 1, state, kMeta);
  }
  expect_file_holds(dir.file("ckpt"), state);
}

}  // namespace
}  // namespace tutti::io
