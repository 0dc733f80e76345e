#include "summary.h"

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <tutti/tutti.h>

namespace example {
namespace {

// The rank the launcher gave this process, before the job has started (0 when alone).
bool launcher_rank_is_zero() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::strcmp(v, "0") == 0;
  }
  return true;
}

// JSON has no NaN or infinity: a non-finite loss is written as its name ("nan", "inf", "-inf").
nlohmann::json loss_value(double loss) {
  if (std::isfinite(loss)) return loss;
  return std::isnan(loss) ? "nan" : (loss > 0 ? "inf" : "-inf");
}

}  // namespace

RunSummary::RunSummary(std::string path) : path_(std::move(path)), writer_(launcher_rank_is_zero()) {}

void RunSummary::set_rank(int rank) {
  writer_ = rank == 0;
  if (!writer_ || path_.empty()) return;
  const bool existed = std::filesystem::exists(path_);
  {
    std::ofstream probe(path_, std::ios::app);
    TUTTI_CHECK_ARG(probe.good(), "--json ", path_, ": cannot write there (", std::strerror(errno), ")");
  }
  if (!existed) std::filesystem::remove(path_);
}

void RunSummary::set_step(std::int64_t steps, double loss) {
  steps_ = steps;
  loss_ = loss;
  if (std::isfinite(loss) && loss >= 0) {
    last_finite_step_ = steps;
    last_finite_loss_ = loss;
  }
}

void RunSummary::diverged() {
  fields_["loss"] = loss_value(loss_);
  fields_["last_finite_loss"] = last_finite_step_ >= 0 ? nlohmann::json(last_finite_loss_) : nlohmann::json();
  fields_["last_finite_step"] = last_finite_step_ >= 0 ? nlohmann::json(last_finite_step_) : nlohmann::json();
  write("diverged");
}

void RunSummary::stopped(const std::string& signal, const std::string& checkpoint) {
  fields_["signal"] = signal;
  fields_["checkpoint"] = checkpoint.empty() ? nlohmann::json() : nlohmann::json(checkpoint);
  write("stopped");
}

void RunSummary::failed(const std::string& error) {
  fields_["error"] = error;
  write("failed");
}

void RunSummary::write(const char* status) {
  // One summary per run: an error while the summary of another ending is written keeps the first.
  if (!writer_ || path_.empty() || written_) return;
  written_ = true;
  fields_["status"] = status;
  if (!fields_.contains("steps")) fields_["steps"] = steps_;
  // A temporary file beside it, then a rename: a reader never sees half a summary.
  // (Where the folder cannot take a new file, the summary is written in place.)
  // Byte-level text in a field (a sample) may not be UTF-8: JSON gets U+FFFD.
  const std::string text = fields_.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const std::string tmp = path_ + ".tmp";
  std::error_code ec;
  std::ofstream out(tmp);
  out << text;
  out.close();
  if (!out.fail()) {
    std::filesystem::rename(tmp, path_, ec);
    if (!ec) return;
    std::filesystem::remove(tmp, ec);
  }
  std::ofstream(path_) << text;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
  }
  return "a signal";
}

}  // namespace example
