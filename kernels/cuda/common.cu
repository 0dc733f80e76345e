#include "kernels/cuda/common.cuh"

namespace tutti::kernels::cuda {

int sm_count() {
  // Per device: a process may use several GPUs over its life (tests do).
  static thread_local int cached_device = -1;
  static thread_local int cached_count = 0;
  int device = 0;
  TUTTI_CUDA_CHECK(cudaGetDevice(&device));
  if (device != cached_device) {
    TUTTI_CUDA_CHECK(cudaDeviceGetAttribute(&cached_count, cudaDevAttrMultiProcessorCount, device));
    cached_device = device;
  }
  return cached_count;
}

}  // namespace tutti::kernels::cuda
