// cuBLAS and cuBLASLt loaded on first use (cublas_loader.cc): libtutti does not link them, and a
// process that never multiplies on a GPU never loads them. Internal header (CUDA builds only).
#pragma once

#include <string>

namespace tutti::detail {

// The address of function `name` in the shared library `library` (a soname, or a path), which is
// loaded on the first call; BackendError naming the library, the function and the loader's
// reason where either cannot be found.
void* cublas_symbol(const char* library, const char* name);

// The sonames tutti loads: libcublas.so.<major> and libcublasLt.so.<major>, the major version of
// the toolkit tutti was built with.
const std::string& cublas_library();
const std::string& cublas_lt_library();

}  // namespace tutti::detail
