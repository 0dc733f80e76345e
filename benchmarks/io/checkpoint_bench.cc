// checkpoint_bench: how long a checkpoint holds the training thread, synchronous against
// asynchronous (io::CheckpointWriter), side by side in one run.
//
//   build/benchmarks/io/checkpoint_bench                       # both states, files in build/bench/checkpoint
//   build/benchmarks/io/checkpoint_bench --states mlp --saves 9 --dir /fast/disk --json out.json
//
// States (synthetic, the shapes and names a trainer saves: "model.<param>", "optim.<param>.exp_avg",
// "optim.<param>.exp_avg_sq", "optim.step"; fp32, on --device):
//   gpt2  GPT-2 small (124M parameters: wte, wpe, 12 blocks, ln_f) with AdamW: ~1.5 GB
//   mlp   the Fashion-MNIST MLP 784-512-256-10 with AdamW: ~6.4 MB
// For each state it runs, one after the other and each with a fresh writer:
//   sync        CheckpointMode::sync: the file is written inside save()
//   async       CheckpointMode::async, WhenBusy::wait, with "long" compute between saves
//               (--long-factor x the sync write's median, and on until the write is done: the
//               shared disk's speed varies 3x within a run): no save waits for a write
//   async-busy  the same with "short" compute (--short-factor x): the next save waits for the write
//   skip-busy   WhenBusy::skip with short compute: saves that find a write in flight are skipped
// Compute between saves is simulated: the training thread spins (one core busy, as a training
// step keeps it) for the given time. The stall of a save is the wall time of save() on the
// training thread; the table gives the median compute between saves (compute_s) and the
// median over --saves saves (the first save, which also
// allocates and faults in the writer's buffers, is in the median and shown alone), the median
// copy and wait, the skipped count, and stall / sync stall.
#include <tutti/tutti.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/stats.h"

namespace {

using namespace tutti;
using Clock = std::chrono::steady_clock;

using bench::median;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The training step, simulated: this thread stays busy for `seconds`.
void spin(double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  volatile std::uint64_t x = 0;
  while (Clock::now() < end) {
    for (int i = 0; i < 1000; ++i) x = x + 1;
  }
}

// Parameter shapes of a model, by name.
using Shapes = std::vector<std::pair<std::string, Shape>>;

Shapes gpt2_small() {
  const std::int64_t d = 768, vocab = 50257, ctx = 1024;
  Shapes s = {{"wte.weight", {vocab, d}}, {"wpe.weight", {ctx, d}}};
  for (int l = 0; l < 12; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    s.push_back({p + "ln_1.weight", {d}});
    s.push_back({p + "ln_1.bias", {d}});
    s.push_back({p + "attn.c_attn.weight", {d, 3 * d}});
    s.push_back({p + "attn.c_attn.bias", {3 * d}});
    s.push_back({p + "attn.c_proj.weight", {d, d}});
    s.push_back({p + "attn.c_proj.bias", {d}});
    s.push_back({p + "ln_2.weight", {d}});
    s.push_back({p + "ln_2.bias", {d}});
    s.push_back({p + "mlp.c_fc.weight", {d, 4 * d}});
    s.push_back({p + "mlp.c_fc.bias", {4 * d}});
    s.push_back({p + "mlp.c_proj.weight", {4 * d, d}});
    s.push_back({p + "mlp.c_proj.bias", {d}});
  }
  s.push_back({"ln_f.weight", {d}});
  s.push_back({"ln_f.bias", {d}});
  return s;
}

Shapes mlp() {
  return {{"0.weight", {512, 784}}, {"0.bias", {512}},       {"2.weight", {256, 512}},
          {"2.bias", {256}},        {"4.weight", {10, 256}}, {"4.bias", {10}}};
}

// Parameters, AdamW's two moments and the step, as a trainer's checkpoint holds them; every
// page written (a state that was never touched would flatter the copy).
StateDict adamw_state(const Shapes& shapes, Device device, std::int64_t& parameters) {
  StateDict s;
  parameters = 0;
  float v = 0.001f;
  for (const auto& [name, shape] : shapes) {
    parameters += numel_of(shape);
    for (const char* key : {"model.", "optim."}) {
      const int copies = key[0] == 'm' ? 1 : 2;
      for (int c = 0; c < copies; ++c) {
        Tensor host = Tensor::empty(shape, DType::f32);
        std::fill_n(host.data_as<float>(), host.numel(), v += 0.001f);
        const std::string full = key + name + (copies == 1 ? "" : c == 0 ? ".exp_avg" : ".exp_avg_sq");
        s[full] = device.is_cpu() ? host : host.to(device);
      }
    }
  }
  s["optim.step"] = int_scalar_tensor(1000);
  return s;
}

struct Config {
  std::string states = "gpt2,mlp";
  int saves = 5;
  int saves_large = 3;  // for gpt2, whose sync write takes seconds
  double long_factor = 1.5;
  double short_factor = 0.2;
  std::string dir = "build/bench/checkpoint";
  std::string device = "cpu";
  std::string modes = "async,async-busy,skip-busy";  // sync always runs: the reference
  std::string json;
};

struct Row {
  std::string state, mode;
  double compute_s = 0;
  int saves = 0, skipped = 0;
  double stall_median_s = 0, stall_first_s = 0, copy_median_s = 0, wait_median_s = 0, write_median_s = 0;
  double finish_s = 0;                        // the last write's tail, waited for by finish() after the loop
  std::vector<double> stalls, copies, waits;  // per save
  std::uint64_t file_bytes = 0;
};

Row run_mode(const std::string& state_name, const std::string& mode, const StateDict& state, const Stream& stream,
             double compute_s, int saves, const std::string& path) {
  io::CheckpointWriterOptions options;
  options.mode = mode == "sync" ? io::CheckpointMode::sync : io::CheckpointMode::async;
  options.when_busy = mode == "skip-busy" ? io::WhenBusy::skip : io::WhenBusy::wait;
  io::CheckpointWriter writer(options);
  const io::Metadata meta = {{"model", state_name}, {"bench", mode}};
  Row row{state_name, mode, compute_s, saves};
  std::vector<double> stall, copy, wait, write, computed;
  for (int i = 0; i < saves; ++i) {
    const auto c0 = Clock::now();
    spin(compute_s);
    // "async": the step is long enough for the write to finish, however slow the shared disk
    // is at that moment (computing on until it has: the table shows the median step).
    while (mode == "async" && writer.busy()) spin(0.01);
    if (i > 0) computed.push_back(seconds_since(c0));
    writer.check();
    const auto t0 = Clock::now();
    const io::SaveResult r = writer.save(path, 100 * (i + 1), state, meta, stream);
    const double s = seconds_since(t0);
    if (i == 0) row.stall_first_s = s;
    stall.push_back(s);
    copy.push_back(r.copy_s);
    wait.push_back(r.waited_s);
    write.push_back(r.write_s);
    row.skipped += r.skipped ? 1 : 0;
    if (r.started) row.file_bytes = r.file_bytes;
  }
  const auto t0 = Clock::now();
  writer.finish();
  row.finish_s = seconds_since(t0);
  if (!computed.empty()) row.compute_s = median(computed);
  row.stalls = stall;
  row.copies = copy;
  row.waits = wait;
  row.stall_median_s = median(stall);
  row.copy_median_s = median(copy);
  row.wait_median_s = median(wait);
  row.write_median_s = median(write);
  // The file is a valid checkpoint of the state (checked once, not timed).
  const io::Checkpoint c = io::load_checkpoint(path);
  if (c.state.size() != state.size()) {
    TUTTI_THROW(Error, "checkpoint_bench: ", path, " holds ", c.state.size(), " entries, not ", state.size());
  }
  std::filesystem::remove(path);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"checkpoint_bench: training-thread stall of synchronous and asynchronous checkpoints"};
  app.add_option("--states", c.states, "comma list of gpt2 (124M AdamW, ~1.5 GB) and mlp (784-512-256-10 AdamW)");
  app.add_option("--saves", c.saves, "saves per mode (mlp)")->check(CLI::PositiveNumber);
  app.add_option("--saves-large", c.saves_large, "saves per mode for gpt2")->check(CLI::PositiveNumber);
  app.add_option("--long-factor", c.long_factor, "long compute between saves, x the sync write's median");
  app.add_option("--short-factor", c.short_factor, "short compute between saves, x the sync write's median");
  app.add_option("--dir", c.dir, "where the checkpoint files go (removed after each mode)");
  app.add_option("--device", c.device, "cpu, or cuda: the state on the GPU (the writer copies into pinned buffers)");
  app.add_option("--modes", c.modes, "comma list of async, async-busy, skip-busy (sync always runs)");
  app.add_option("--json", c.json, "write the rows as JSON to this path");
  CLI11_PARSE(app, argc, argv);

  try {
    const Device device = Device::parse(c.device);
    device.require_available();
    const Stream stream = device.is_cpu() ? Stream() : Stream::create(device);
    std::filesystem::create_directories(c.dir);
    std::printf("# checkpoint_bench: files in %s, device %s; compute between saves is a spinning thread\n",
                c.dir.c_str(), device.str().c_str());
    std::printf("%-5s %-10s %9s %5s %4s %11s %10s %9s %9s %10s %7s\n", "state", "mode", "compute_s", "saves", "skip",
                "stall_ms", "first_ms", "copy_ms", "wait_ms", "finish_ms", "ratio");
    std::vector<Row> rows;
    std::stringstream list(c.states);
    for (std::string name; std::getline(list, name, ',');) {
      if (name != "gpt2" && name != "mlp") TUTTI_THROW(InvalidArgument, "checkpoint_bench: unknown state '", name, "'");
      std::int64_t parameters = 0;
      const StateDict state = adamw_state(name == "gpt2" ? gpt2_small() : mlp(), device, parameters);
      const int saves = name == "gpt2" ? c.saves_large : c.saves;
      const std::string path = (std::filesystem::path(c.dir) / (name + ".tckp")).string();
      const Row sync = run_mode(name, "sync", state, stream, 0.0, saves, path);
      const double write_s = sync.stall_median_s;
      std::vector<Row> mine = {sync};
      for (const char* mode : {"async", "async-busy", "skip-busy"}) {
        if (("," + c.modes + ",").find("," + std::string(mode) + ",") == std::string::npos) continue;
        const double factor = std::string(mode) == "async" ? c.long_factor : c.short_factor;
        mine.push_back(run_mode(name, mode, state, stream, factor * write_s, saves, path));
      }
      std::printf("# %s: %lld parameters, file %.1f MB\n", name.c_str(), static_cast<long long>(parameters),
                  static_cast<double>(sync.file_bytes) / 1e6);
      for (const Row& r : mine) {
        std::printf("%-5s %-10s %9.3f %5d %4d %11.2f %10.2f %9.2f %9.2f %10.2f %7.3f\n", r.state.c_str(),
                    r.mode.c_str(), r.compute_s, r.saves, r.skipped, 1e3 * r.stall_median_s, 1e3 * r.stall_first_s,
                    1e3 * r.copy_median_s, 1e3 * r.wait_median_s, 1e3 * r.finish_s,
                    r.stall_median_s / sync.stall_median_s);
        std::fflush(stdout);
        rows.push_back(r);
      }
    }
    if (!c.json.empty()) {
      nlohmann::json out = nlohmann::json::array();
      for (const Row& r : rows) {
        out.push_back({{"state", r.state},
                       {"mode", r.mode},
                       {"compute_s", r.compute_s},
                       {"saves", r.saves},
                       {"skipped", r.skipped},
                       {"stall_median_s", r.stall_median_s},
                       {"stall_first_s", r.stall_first_s},
                       {"copy_median_s", r.copy_median_s},
                       {"wait_median_s", r.wait_median_s},
                       {"write_median_s", r.write_median_s},
                       {"finish_s", r.finish_s},
                       {"stalls_s", r.stalls},
                       {"copies_s", r.copies},
                       {"waits_s", r.waits},
                       {"file_bytes", r.file_bytes}});
      }
      std::ofstream(c.json) << out.dump(2) << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
