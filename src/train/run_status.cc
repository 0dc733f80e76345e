// train::Run's status file (for a launcher: include/tutti/train/run.h) and its accounting
// (include/tutti/train/accounting.h): the attempts of one run, the rank-hours, the time that
// survived in the state, the cost.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "train/run_impl.h"
#include "tutti/core/error.h"

namespace tutti::train {
namespace {

// A JSON number, or null for "none" (negative) and for what JSON cannot hold.
nlohmann::json number_or_null(double v) { return v >= 0 && std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

}  // namespace

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

double process_started_unix() {
  const double now = unix_now();
  // /proc/self/stat's 22nd field: the start in clock ticks since boot; /proc/uptime: now since boot.
  std::ifstream stat("/proc/self/stat");
  std::ifstream uptime_file("/proc/uptime");
  std::string text;
  double uptime = 0;
  if (!std::getline(stat, text) || !(uptime_file >> uptime)) return now;
  const std::size_t close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos || close + 2 >= text.size()) return now;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  char* end = nullptr;
  const double ticks = std::strtod(field.c_str(), &end);
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (end == field.c_str() || hz <= 0) return now;
  const double started = now - (uptime - ticks / static_cast<double>(hz));
  return started <= now ? started : now;
}

StateDict Run::Impl::run_scalars() const {
  return {{kStep, int_scalar_tensor(step)},
          {kLastLoss, scalar_tensor(loss)},
          {kUsefulUs, int_scalar_tensor(std::llround(useful_s * 1e6))}};
}

void Run::Impl::start_status() {
  const char* env_file = std::getenv("TUTTI_STATUS_FILE");
  const char* env_id = std::getenv("TUTTI_ATTEMPT_ID");
  attempt_id = env_id ? env_id : "";
  status_path = options.status_file.empty() && env_file ? env_file : options.status_file;
  useful_s = restored_useful_s;
  // Without the status of the attempts before, a resumed state is taken to have cost its own
  // time: the run started that much before this attempt, and nothing was lost.
  std::int64_t carried[3] = {std::llround((attempt_started_unix - restored_useful_s) * 1e6), 0, 1};  // us
  if (rank == 0 && resumed && !status_path.empty()) {
    std::ifstream in(status_path);
    nlohmann::json old = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (old.is_object() && old.contains("accounting") && old["accounting"].is_object()) {
      const nlohmann::json& a = old["accounting"];
      const double started = old.value("run_started_unix", 0.0);
      if (started > 0 && started <= attempt_started_unix) {
        carried[0] = std::llround(started * 1e6);
        carried[1] = std::llround(a.value("rank_hours", 0.0) * 3600 * 1e6);
        carried[2] = a.value("attempts", 1) + 1;
      }
    }
  }
  const auto take = [this](const std::vector<std::int64_t>& v) {
    run_started_unix = static_cast<double>(v[0]) / 1e6;
    earlier_rank_seconds = static_cast<double>(v[1]) / 1e6;
    attempts = static_cast<int>(v[2]);
  };
  // A status file that cannot be written would leave the launcher blind: every rank fails at
  // the start, rank 0 with the cause.
  std::string failure;
  if (rank == 0) {
    take({carried[0], carried[1], carried[2]});
    if (!status_path.empty()) {
      try {
        write_status("running", true);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
  }
  const Tensor t = Tensor::from_ints({carried[0], carried[1], carried[2], failure.empty() ? 0 : 1}, {4}, DType::i64);
  CallOptions call;
  call.label = "train::Run accounting";
  cpu_comm->broadcast(t, 0, call).wait();
  const std::vector<std::int64_t> v = t.to_ints();
  take(v);
  if (rank != 0) status_path.clear();
  TUTTI_CHECK_ARG(v[3] == 0, "train::Run: the status file ", status_path.empty() ? "of rank 0" : status_path,
                  " (RunOptions::status_file or $TUTTI_STATUS_FILE) cannot be written",
                  failure.empty() ? std::string() : ": " + failure);
}

void Run::Impl::write_status(const char* state_name, bool force, int exit_code, const std::string& message) {
  if (status_path.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - status_written < std::chrono::milliseconds(200)) return;
  status_written = now;
  status_saved_step = saved_step;
  const Accounting a = account();
  nlohmann::json j;
  j["format"] = "tutti-status 1";
  j["state"] = state_name;
  j["step"] = step;
  j["steps"] = options.steps;
  j["first_step"] = first_step;
  j["resumed_from"] = !resumed ? nlohmann::json() : nlohmann::json(from_memory ? "memory" : "checkpoint");
  j["checkpoint"] = path.empty() ? nlohmann::json() : nlohmann::json(path);
  j["checkpoint_step"] = saved_step >= 0 ? nlohmann::json(saved_step) : nlohmann::json();
  j["snapshot_step"] = snapshot_step >= 0 ? nlohmann::json(snapshot_step) : nlohmann::json();
  j["snapshot_every"] = snapshot_every;
  j["loss"] = number_or_null(loss);
  j["ranks"] = world;
  j["host"] = hostname;
  j["pid"] = static_cast<std::int64_t>(::getpid());
  j["attempt_id"] = attempt_id;
  j["run_started_unix"] = run_started_unix;
  j["attempt_started_unix"] = attempt_started_unix;
  j["first_step_done_unix"] = first_step_done_unix > 0 ? nlohmann::json(first_step_done_unix) : nlohmann::json();
  j["updated_unix"] = unix_now();
  j["exit_code"] = exit_code >= 0 ? nlohmann::json(exit_code) : nlohmann::json();
  j["message"] = message;
  j["preempted_hosts"] = preempted_hosts;
  j["accounting"] = {{"attempts", a.attempts},
                     {"wall_seconds", a.wall_seconds},
                     {"rank_hours", a.rank_hours},
                     {"useful_seconds", a.useful_seconds},
                     {"goodput", a.goodput},
                     {"lost_seconds", a.lost_seconds},
                     {"cost", a.cost},
                     {"cost_per_million", a.cost_per_million},
                     {"work_unit", options.work_unit},
                     {"price_per_hour", options.price_per_hour}};
  // Replaced atomically for a reader (rename), without fsync: a report, not the run's state.
  // Once the first write succeeded, a failed one is left for the next (a full disk must not
  // end a run that its checkpoints keep).
  const std::string text = j.dump(1) + "\n";
  const std::filesystem::path target(status_path);
  const std::string tmp = status_path + ".tmp" + std::to_string(::getpid());
  try {
    if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << text;
      out.close();
      TUTTI_CHECK(out.good(), "writing ", tmp, " failed");
    }
    std::filesystem::rename(tmp, target);
  } catch (const std::exception&) {
    if (!status_started) throw;
  }
  status_started = true;
}

Accounting Run::Impl::account() const {
  const double now = unix_now();
  Accounting a;
  a.attempts = attempts;
  a.wall_seconds = std::max(now - run_started_unix, 0.0);
  a.rank_hours = (earlier_rank_seconds + world * std::max(now - attempt_started_unix, 0.0)) / 3600;
  a.useful_seconds = useful_s;
  a.goodput = a.wall_seconds > 0 ? std::min(useful_s / a.wall_seconds, 1.0) : 0;
  // Only an earlier attempt's status tells the time before this one (else it is the resumed state's own).
  if (attempts > 1) a.lost_seconds = std::max(attempt_started_unix - run_started_unix - restored_useful_s, 0.0);
  if (options.price_per_hour > 0) {
    a.cost = options.price_per_hour * a.rank_hours;
    const double work = static_cast<double>(step) * options.work_per_step;
    if (work > 0) a.cost_per_million = a.cost / (work / 1e6);
  }
  return a;
}

void Run::Impl::note_step_time() {
  const auto now = std::chrono::steady_clock::now();
  useful_s += std::chrono::duration<double>(now - step_began).count();
  if (first_step_done_unix == 0) first_step_done_unix = unix_now();
}

void Run::Impl::write_failed_status() noexcept {
  if (status_path.empty() || phase == Phase::finished) return;
  try {
    const std::string why = std::uncaught_exceptions() > 0
                                ? "an error ended the run at step " + std::to_string(step)
                                : "the run was left at step " + std::to_string(step) + " without finish()";
    write_status("failed", true, -1, why);
  } catch (...) {  // a destructor: the report is lost, the error that brought us here is not
  }
}

Accounting Run::accounting() const { return impl_->account(); }

}  // namespace tutti::train
