#include "tutti/core/error.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/last_error.h"

namespace tutti {
namespace {

int rank_from_environment() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::atoi(v);
  }
  return -1;
}

std::atomic<int>& rank_slot() {
  static std::atomic<int> rank{rank_from_environment()};
  return rank;
}

thread_local const ErrorContext* innermost_context = nullptr;
thread_local int thread_rank = -1;  // set_thread_error_rank; negative: the process's rank

// The last tutti error made in this process (see core/last_error.h).
struct LastError {
  std::mutex mutex;
  std::string what;
  std::chrono::steady_clock::time_point when;
};
LastError& last_error() {
  static LastError* e = new LastError;  // never destroyed: errors may be made during exit
  return *e;
}

std::string format(const std::string& message, const std::string& where, int rank) {
  std::string out = "tutti";
  if (rank >= 0) out += " [rank " + std::to_string(rank) + "]";
  out += " " + where + ": " + message;
  if (std::string ctx = current_error_context(); !ctx.empty()) out += " (" + ctx + ")";
  return out;
}

}  // namespace

Error::Error(std::string message, std::string where, int rank)
    : std::runtime_error(format(message, where, rank)),
      message_(std::move(message)),
      where_(std::move(where)),
      rank_(rank) {
  LastError& last = last_error();
  std::lock_guard lock(last.mutex);
  last.what = what();
  last.when = std::chrono::steady_clock::now();
}

int error_rank() { return thread_rank >= 0 ? thread_rank : rank_slot().load(std::memory_order_relaxed); }
void set_error_rank(int rank) { rank_slot().store(rank, std::memory_order_relaxed); }
void set_thread_error_rank(int rank) { thread_rank = rank; }

ErrorContext::ErrorContext(std::string what) : what_(std::move(what)), outer_(innermost_context) {
  innermost_context = this;
}
ErrorContext::~ErrorContext() { innermost_context = outer_; }

std::string current_error_context() {
  std::string out;
  for (const ErrorContext* c = innermost_context; c != nullptr; c = c->outer_) {
    if (!out.empty()) out += "; ";
    out += "while " + c->what_;
  }
  return out;
}

namespace detail {
std::optional<std::string> recent_error(double max_age_s) {
  LastError& last = last_error();
  std::lock_guard lock(last.mutex);
  if (last.what.empty()) return std::nullopt;
  if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last.when).count() > max_age_s)
    return std::nullopt;
  return last.what;
}

std::string strip_path(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}
}  // namespace detail

}  // namespace tutti
