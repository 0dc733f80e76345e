// Errors: every failure in tutti is a C++ exception derived from tutti::Error.
//
// A message names where it happened (file:line), the rank of the process (when known), what
// failed (the call's text, the foreign error's name) and what tutti was doing at the time
// (the innermost ErrorContext on this thread). Library code never calls exit() and never
// prints to stdout on its own.
//
// doc-test: wrap-main
// setup: const int n = 8;
// setup: const tutti::Tensor x = tutti::Tensor::zeros({4}, tutti::DType::f32), y = x;
//   TUTTI_CHECK(n > 0, "batch size must be positive, got ", n);       // throws tutti::Error
//   TUTTI_CHECK_ARG(x.dtype() == tutti::DType::f32, "relu: x must be f32");  // throws InvalidArgument
//   TUTTI_ENFORCE_EQ(x.numel(), y.numel(), "add: x and y");           // prints both values
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tutti {

// Base of every tutti exception. what() is the full, formatted message.
class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string where, int rank);
  // The message without the location and rank prefix.
  const std::string& message() const { return message_; }
  // "file.cc:42".
  const std::string& where() const { return where_; }
  // World rank of the process that raised it, or -1 when not known.
  int rank() const { return rank_; }

 private:
  std::string message_;
  std::string where_;
  int rank_;
};

// The caller passed something wrong: shapes, dtypes, devices, values, flags.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A foreign API failed: CUDA, cuBLAS, cuDNN, NCCL, MPI, the C library.
class BackendError : public Error {
 public:
  using Error::Error;
};

// A wait exceeded its deadline (a collective that other ranks never joined, for example).
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The world rank errors report. Bootstrap sets it; before that it is read once from the
// launcher's environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID), else -1.
int error_rank();
void set_error_rank(int rank);
// Ranks that are threads of one process (tutti::ThreadGroup): this thread's errors report
// `rank` instead of the process's; a negative rank removes the override.
void set_thread_error_rank(int rank);

// Says what this thread is doing, for as long as it lives; an error raised meanwhile ends
// with "(while <what>[; while <outer>...])". Cheap: one pointer push and pop.
class ErrorContext {
 public:
  explicit ErrorContext(std::string what);
  ~ErrorContext();
  ErrorContext(const ErrorContext&) = delete;
  ErrorContext& operator=(const ErrorContext&) = delete;

 private:
  std::string what_;
  const ErrorContext* outer_;
  friend std::string current_error_context();
};
// "while a; while b" for the contexts active on this thread, innermost first ("" if none).
std::string current_error_context();

namespace detail {
// "dir/sub/file.cc" -> "file.cc".
std::string strip_path(const char* file);
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
// Builds the full message (rank, where, text, context) and throws E.
template <typename E>
[[noreturn]] void throw_error(const char* file, int line, std::string message) {
  std::string where = strip_path(file) + ":" + std::to_string(line);
  throw E(std::move(message), std::move(where), error_rank());
}
}  // namespace detail

}  // namespace tutti

#define TUTTI_THROW(ExceptionType, ...) \
  ::tutti::detail::throw_error<::tutti::ExceptionType>(__FILE__, __LINE__, ::tutti::detail::str(__VA_ARGS__))

// Throws tutti::Error when cond is false; the message says which condition failed.
#define TUTTI_CHECK(cond, ...)                                                            \
  do {                                                                                    \
    if (!(cond)) [[unlikely]] {                                                           \
      TUTTI_THROW(Error, "check failed: " #cond ": ", ::tutti::detail::str(__VA_ARGS__)); \
    }                                                                                     \
  } while (0)

// Throws tutti::InvalidArgument when cond is false: use it for checks of caller input.
#define TUTTI_CHECK_ARG(cond, ...)               \
  do {                                           \
    if (!(cond)) [[unlikely]] {                  \
      TUTTI_THROW(InvalidArgument, __VA_ARGS__); \
    }                                            \
  } while (0)

// ENFORCE-style comparisons: on failure the message prints both expressions and values,
// "expected x.numel() == y.numel() (12 vs 10): add: x and y". Throws InvalidArgument.
#define TUTTI_ENFORCE_OP_(a, b, op, ...)                                                           \
  do {                                                                                             \
    const auto& tutti_a_ = (a);                                                                    \
    const auto& tutti_b_ = (b);                                                                    \
    if (!(tutti_a_ op tutti_b_)) [[unlikely]] {                                                    \
      TUTTI_THROW(InvalidArgument, "expected " #a " " #op " " #b " (", tutti_a_, " vs ", tutti_b_, \
                  "): ", ::tutti::detail::str(__VA_ARGS__));                                       \
    }                                                                                              \
  } while (0)
#define TUTTI_ENFORCE_EQ(a, b, ...) TUTTI_ENFORCE_OP_(a, b, ==, __VA_ARGS__)
#define TUTTI_ENFORCE_NE(a, b, ...) TUTTI_ENFORCE_OP_(a, b, !=, __VA_ARGS__)
#define TUTTI_ENFORCE_LT(a, b, ...) TUTTI_ENFORCE_OP_(a, b, <, __VA_ARGS__)
#define TUTTI_ENFORCE_LE(a, b, ...) TUTTI_ENFORCE_OP_(a, b, <=, __VA_ARGS__)
#define TUTTI_ENFORCE_GT(a, b, ...) TUTTI_ENFORCE_OP_(a, b, >, __VA_ARGS__)
#define TUTTI_ENFORCE_GE(a, b, ...) TUTTI_ENFORCE_OP_(a, b, >=, __VA_ARGS__)
