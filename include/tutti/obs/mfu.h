// MFU (model FLOPs utilization): the model's training FLOPs per second over the device's peak.
// The model's FLOPs come from its layers (nn::Module::flops, summed by Sequential); the peak
// from here: a table of known GPUs (dense peaks from the vendors' data sheets, without
// sparsity), the measured GEMM ceiling of this process on the CPU, or an override.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tutti/core/device.h"
#include "tutti/core/dtype.h"

namespace tutti::obs {

// Dense peak FLOP/s of a known GPU for the dtype the GEMMs run in: f16/bf16 on the tensor
// cores, f32 on the CUDA cores (tutti's cuBLAS calls compute in fp32, no TF32). `device_name`
// as CUDA names it ("NVIDIA H200"); the first row whose name it contains wins. 0 when unknown.
double gpu_peak_flops(std::string_view device_name, DType compute);

// This process's GEMM ceiling on the CPU, measured as training runs: f32 GEMMs (n x n x n)
// through tutti's CPU kernel with the kernel set OpenBLAS chose for this process
// (OPENBLAS_CORETYPE) and the process's threads (kernels::set_cpu_threads: a rank's share of
// the cores), warmed up for 0.05 s, then the best call over about min_seconds. Ranks sharing a
// host should measure at the same time (each then gets its share of the cores, as in training).
// Not collective. Other processes can only slow a call, so the result errs low: on a shared
// machine a whole measurement can fall in a slow spell (2 cores shared with other jobs measured
// 32 and 64 GFLOP/s minutes apart; see remeasure_peak).
double measure_cpu_gemm_flops(int n = 384, double min_seconds = 0.2);

struct PeakFlops {
  double flops = 0;       // FLOP/s per rank; 0: unknown (no MFU)
  std::string source;     // "override", "table: NVIDIA H200, bf16", "measured CPU GEMM (f32)", "unknown GPU ..."
  bool measured = false;  // measured here (the CPU ceiling), not given or looked up
};

// The peak MFU is measured against, for one rank computing in `compute` on `device`:
// override_tflops > 0 (a flag), else TUTTI_PEAK_TFLOPS, else the table for a GPU, else on the
// CPU the measured GEMM ceiling: `measured_before` when positive (the best measurement of the
// run's earlier attempts, kept in its checkpoint: a relaunched attempt then starts training
// ~0.25 s sooner), else measure_cpu_gemm_flops run here (~0.25 s).
PeakFlops peak_flops(Device device, DType compute, double override_tflops = 0, double measured_before = 0);

// A measured peak measured again (every rank of a host at the same time), for min_seconds, and
// the larger of the two kept; any other peak as it is. A measurement that other processes slowed
// underestimates the ceiling, and an underestimate inflates MFU, past 100% when training ran
// faster than the measurement. The trainers probe while they train (peak_probe_due) and state
// MFU against the best probe so far: one figure per run, that any quiet moment corrects
// (docs/observability.md, "MFU").
PeakFlops remeasure_peak(PeakFlops peak, double min_seconds = 0.2);

// Whether a trainer probes the peak again after `steps_done` steps of its run: after 1, 2, 4, 8,
// ... steps (a probe of 0.05 s costs a run of n steps log2(n) x 0.05 s), and after the last step
// with the full 0.2 s. Every rank reaches the same steps, so the ranks of a host probe together.
// Count the run's steps, not the attempt's: a resumed attempt that kept the peak (peak_flops'
// `measured_before`) then goes on with the run's schedule instead of probing 10 times in its
// first 1,000 steps.
inline bool peak_probe_due(std::int64_t steps_done) { return steps_done > 0 && (steps_done & (steps_done - 1)) == 0; }

// MFU of `ranks` ranks together: flops_per_item x items_per_s / (ranks x peak_flops); 0 when
// the peak is unknown.
inline double mfu(double flops_per_item, double items_per_s, int ranks, double peak_flops_per_rank) {
  return peak_flops_per_rank > 0 ? flops_per_item * items_per_s / (ranks * peak_flops_per_rank) : 0.0;
}

}  // namespace tutti::obs
