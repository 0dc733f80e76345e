#include "tutti/kernels/threads.h"

#include <cblas.h>

#include <array>
#include <string_view>

#include "kernels/cpu/conv.h"
#include "tutti/core/error.h"

namespace tutti::kernels {

void set_cpu_threads(int threads) {
  TUTTI_CHECK_ARG(threads >= 1, "set_cpu_threads: threads must be >= 1, got ", threads);
  openblas_set_num_threads(threads);
}

int cpu_threads() { return openblas_get_num_threads(); }

namespace {

// OpenBLAS's x86-64 kernel sets that have AVX2 GEMM kernels (its names, as
// openblas_get_corename() gives them, compared without case).
bool has_avx2_kernels(std::string_view core) {
  constexpr std::array<std::string_view, 6> avx2 = {"haswell",        "skylakex", "cooperlake",
                                                    "sapphirerapids", "zen",      "excavator"};
  std::string lower(core);
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  for (std::string_view name : avx2) {
    if (lower == name) return true;
  }
  return false;
}

// The kernel sets among those whose GEMMs use AVX-512.
bool has_avx512_kernels(std::string_view core) {
  constexpr std::array<std::string_view, 3> avx512 = {"skylakex", "cooperlake", "sapphirerapids"};
  std::string lower(core);
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  for (std::string_view name : avx512) {
    if (lower == name) return true;
  }
  return false;
}

}  // namespace

CpuBlasInfo cpu_blas_info() {
  CpuBlasInfo info;
  const char* core = openblas_get_corename();
  info.core = core != nullptr ? core : "unknown";
  info.conv = cpu::conv2d_backend();
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // GCC's checks include the OS's consent (XCR0) for the AVX and AVX-512 register states.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    info.cpu_isa = "avx512";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    info.cpu_isa = "avx2";
  } else if (__builtin_cpu_supports("avx")) {
    info.cpu_isa = "avx";
  } else {
    info.cpu_isa = "sse";
  }
  if ((info.cpu_isa == "avx512" || info.cpu_isa == "avx2") && !has_avx2_kernels(info.core)) {
    info.suggested = info.cpu_isa == "avx512" ? "SkylakeX" : "Haswell";
  } else if (info.cpu_isa == "avx512" && !has_avx512_kernels(info.core)) {
    info.suggested = "SkylakeX";
  }
#else
  info.cpu_isa = "other";
#endif
  return info;
}

std::string CpuBlasInfo::warning() const {
  if (suggested.empty()) return "";
  if (has_avx2_kernels(core)) {
    return "OpenBLAS runs its " + core +
           " kernels (AVX2) on a CPU with AVX-512 (OPENBLAS_CORETYPE says so, or OpenBLAS knows the CPU's model "
           "only as AVX2): the CPU GEMMs can run up to 1.6x faster on its AVX-512 kernels. Unset OPENBLAS_CORETYPE, "
           "or set OPENBLAS_CORETYPE=" +
           suggested + ", before starting the job (mpirun -x OPENBLAS_CORETYPE for other nodes)";
  }
  return "OpenBLAS runs its " + core + " kernels on a CPU with " + (cpu_isa == "avx512" ? "AVX-512" : "AVX2") +
         " (it did not recognize the CPU's model): the CPU GEMMs run several times slower than they could. "
         "Set OPENBLAS_CORETYPE=" +
         suggested +
         " in the environment before starting the job (mpirun passes it "
         "to local ranks; add -x OPENBLAS_CORETYPE for other nodes)";
}

}  // namespace tutti::kernels
