#include "tutti/kernels/threads.h"

#include <cblas.h>

#include "tutti/core/error.h"

namespace tutti::kernels {

void set_cpu_threads(int threads) {
  TUTTI_CHECK_ARG(threads >= 1, "set_cpu_threads: threads must be >= 1, got ", threads);
  openblas_set_num_threads(threads);
}

int cpu_threads() { return openblas_get_num_threads(); }

}  // namespace tutti::kernels
