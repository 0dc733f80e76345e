#include "tutti/core/error.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

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
      rank_(rank) {}

int error_rank() { return rank_slot().load(std::memory_order_relaxed); }
void set_error_rank(int rank) { rank_slot().store(rank, std::memory_order_relaxed); }

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
std::string strip_path(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}
}  // namespace detail

}  // namespace tutti
