// TUTTI_NCCL_CHECK(call): a failed NCCL call becomes a tutti::BackendError with the call's
// text, NCCL's error name and string, its last error message, file:line and the rank.
// Internal header, TUTTI_WITH_NCCL builds.
#pragma once

#include <nccl.h>

#include "tutti/core/error.h"

namespace tutti::detail {
inline const char* nccl_result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult(unknown)";
  }
}
}  // namespace tutti::detail

#define TUTTI_NCCL_CHECK(call)                                                                         \
  do {                                                                                                 \
    const ncclResult_t tutti_nr_ = (call);                                                             \
    if (tutti_nr_ != ncclSuccess && tutti_nr_ != ncclInProgress) [[unlikely]]                          \
      ::tutti::detail::throw_error<::tutti::BackendError>(                                             \
          __FILE__, __LINE__,                                                                          \
          ::tutti::detail::str(#call, " failed: ", ::tutti::detail::nccl_result_name(tutti_nr_), ": ", \
                               ncclGetErrorString(tutti_nr_)));                                        \
  } while (0)
