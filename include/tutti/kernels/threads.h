// The CPU kernels' GEMM library (OpenBLAS): its threads, and which of its kernel sets it runs.
//
// Threads: the OpenBLAS GEMMs of Linear, Conv2d and attention use this many threads, and so do
// Conv2d's oneDNN primitives where tutti runs its f32 convolutions on oneDNN (CpuBlasInfo::conv);
// the other CPU kernels run on the calling thread. Process-wide. tutti::Job sets it when the job starts
// (JobOptions::cpu_threads): with several ranks on one host, each rank's GEMMs should use its
// share of the cores, not all of them.
//
// Kernel set: OpenBLAS picks its kernels once, when it is loaded, from the CPU's model number.
// A CPU it does not know (a new model, or a virtual machine that hides the model) gets its
// oldest x86-64 kernels (SSE3, "Prescott"): on a 2-core AVX-512 machine measured 3.5x slower
// GEMMs than its "SkylakeX" kernels (docs/benchmarks.md). Nothing in the process can change the
// choice afterwards; the environment variable OPENBLAS_CORETYPE, set before the program starts,
// does. cpu_blas_info() says when the choice is that bad, and what to set. It also says when
// an AVX-512 CPU runs AVX2 kernels (OPENBLAS_CORETYPE=Haswell in the environment, or a CPU
// model OpenBLAS knows only as AVX2): on a 2-core AMD EPYC with AVX-512, train_gpt's gpt-tiny
// ran 1.6x faster on the "Cooperlake" kernels OpenBLAS chose itself than on "Haswell".
#pragma once

#include <string>

namespace tutti::kernels {

// threads >= 1; throws InvalidArgument otherwise.
void set_cpu_threads(int threads);
int cpu_threads();

struct CpuBlasInfo {
  std::string core;       // OpenBLAS's kernel set in use: "SkylakeX", "Haswell", "Prescott", ...
  std::string cpu_isa;    // the widest vector ISA of this CPU that the OS enables: "avx512", "avx2", "avx", "sse"
  std::string suggested;  // OPENBLAS_CORETYPE to set: non-empty only when `core` has no AVX2
                          // kernels but the CPU has AVX2 ("Haswell") or AVX-512 ("SkylakeX"),
                          // or `core` has AVX2 kernels only and the CPU AVX-512 ("SkylakeX")
  std::string conv;       // what the CPU convolutions run on: "oneDNN 2.6.3 (avx512_core_bf16, OpenMP)
                          // for f32, im2col + OpenBLAS for halves", or "im2col + OpenBLAS" (a build
                          // without oneDNN: TUTTI_WITH_ONEDNN)
  // One sentence for a log when `suggested` is set (what happened, the cost, the fix); else empty.
  std::string warning() const;
};
CpuBlasInfo cpu_blas_info();

}  // namespace tutti::kernels
