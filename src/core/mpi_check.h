// TUTTI_MPI_CHECK(call): a failed MPI call becomes a tutti::BackendError with the call's text,
// MPI's error string (which starts with the error class name, "MPI_ERR_COUNT: ..."),
// file:line and the rank. Communicators must use MPI_ERRORS_RETURN for this to see errors.
// Internal header.
#pragma once

#include <mpi.h>

#include "tutti/core/error.h"

namespace tutti::detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
}  // namespace tutti::detail

#define TUTTI_MPI_CHECK(call)                                                 \
  do {                                                                        \
    const int tutti_rc_ = (call);                                             \
    if (tutti_rc_ != MPI_SUCCESS) [[unlikely]]                                \
      ::tutti::detail::throw_mpi_error(tutti_rc_, #call, __FILE__, __LINE__); \
  } while (0)
