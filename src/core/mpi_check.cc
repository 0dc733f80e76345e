#include "core/mpi_check.h"

#include <cstdio>

namespace tutti::detail {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) {
    std::snprintf(text, sizeof text, "MPI error code %d", code);
  }
  int error_class = code;
  MPI_Error_class(code, &error_class);
  throw_error<BackendError>(file, line, str(call, " failed: ", text, " (error class ", error_class, ")"));
}

}  // namespace tutti::detail
