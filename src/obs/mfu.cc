#include "tutti/obs/mfu.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "core/gpu_runtime.h"
#include "tutti/core/error.h"
#include "tutti/core/tensor.h"
#include "tutti/kernels/linear.h"

namespace tutti::obs {

double gpu_peak_flops(std::string_view device_name, DType compute) {
  struct Row {
    const char* name;  // a substring of the CUDA device name; earlier rows win
    double half_tflops, fp32_tflops;
  };
  // Dense (no sparsity) TFLOP/s from the data sheets. H100 SXM's name is "H100 80GB HBM3", so
  // "H100 PCIe" must come first.
  static const Row kTable[] = {
      {"H200", 989.4, 66.9}, {"H100 PCIe", 756.5, 51.2}, {"H100", 989.4, 66.9}, {"A100", 312.0, 19.5},
      {"L40S", 362.1, 91.6}, {"A10", 125.0, 31.2},       {"V100", 125.0, 15.7}, {"RTX 4090", 165.2, 82.6},
  };
  for (const Row& r : kTable) {
    if (device_name.find(r.name) != std::string_view::npos) {
      return 1e12 * (compute == DType::f32 ? r.fp32_tflops : r.half_tflops);
    }
  }
  return 0;
}

double measure_cpu_gemm_flops(int n, double min_seconds) {
  TUTTI_CHECK_ARG(n > 0 && min_seconds > 0, "measure_cpu_gemm_flops: n and min_seconds must be positive");
  using Clock = std::chrono::steady_clock;
  Tensor a = Tensor::empty({n, n}, DType::f32), b = Tensor::empty({n, n}, DType::f32),
         c = Tensor::empty({n, n}, DType::f32);
  float* pa = a.data_as<float>();
  float* pb = b.data_as<float>();
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(n) * n; ++i) {
    pa[i] = static_cast<float>((i * 7) % 13) * 0.01f;
    pb[i] = static_cast<float>((i * 5) % 11) * 0.01f;
  }
  // Warm-up, untimed, as training is warm: OpenBLAS's threads started and spinning, the pages
  // touched, the caches and the clock up (the first calls ran up to 2x slower than later ones).
  const Clock::time_point warm = Clock::now();
  for (int i = 0; i < 2 || std::chrono::duration<double>(Clock::now() - warm).count() < 0.05; ++i) {
    kernels::matmul(a, false, b, false, c);
  }
  const double flops_per_call = 2.0 * n * static_cast<double>(n) * n;
  // The best call: other processes (a busy core, a hypervisor taking the virtual CPU) only ever
  // slow a call down, so the fastest one is the closest to the ceiling.
  double best = 0;
  const Clock::time_point start = Clock::now();
  int calls = 0;
  while (calls < 3 || std::chrono::duration<double>(Clock::now() - start).count() < min_seconds) {
    const Clock::time_point t0 = Clock::now();
    kernels::matmul(a, false, b, false, c);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) best = std::max(best, flops_per_call / s);
    ++calls;
  }
  return best;
}

PeakFlops peak_flops(Device device, DType compute, double override_tflops, double measured_before) {
  if (override_tflops > 0) return {override_tflops * 1e12, "override"};
  if (const char* env = std::getenv("TUTTI_PEAK_TFLOPS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    TUTTI_CHECK_ARG(end != env && *end == '\0' && v > 0, "TUTTI_PEAK_TFLOPS='", env, "' is not a positive number");
    return {v * 1e12, "override (TUTTI_PEAK_TFLOPS)"};
  }
  if (device.is_cuda()) {
    const std::string name = gpu::device_name(device.index);
    const double peak = gpu_peak_flops(name, compute);
    if (peak > 0) return {peak, "table: " + name + ", " + std::string(name_of(compute))};
    return {0, "unknown GPU " + name + " (give the peak with an override)"};
  }
  return {measured_before > 0 ? measured_before : measure_cpu_gemm_flops(), "measured CPU GEMM (f32)", true};
}

PeakFlops remeasure_peak(PeakFlops peak, double min_seconds) {
  if (peak.measured) peak.flops = std::max(peak.flops, measure_cpu_gemm_flops(384, min_seconds));
  return peak;
}

}  // namespace tutti::obs
