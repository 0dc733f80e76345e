// TUTTI_CUDNN_CHECK(call): a failed cuDNN call becomes a tutti::BackendError with the call's
// text, the status name, file:line and the rank. Internal header, TUTTI_WITH_CUDNN builds.
#pragma once

#include <cudnn.h>

#include "tutti/core/error.h"

#define TUTTI_CUDNN_CHECK(call)                                                                 \
  do {                                                                                          \
    const cudnnStatus_t tutti_st_ = (call);                                                     \
    if (tutti_st_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                                         \
      ::tutti::detail::throw_error<::tutti::BackendError>(                                      \
          __FILE__, __LINE__,                                                                   \
          ::tutti::detail::str(#call, " failed: ", cudnnGetErrorString(tutti_st_), " (status ", \
                               static_cast<int>(tutti_st_), ")"));                              \
  } while (0)
