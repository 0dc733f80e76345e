#include "run_support.h"

#include <zlib.h>

#include <cstdio>

namespace example {

tutti::DType dtype_flag(const std::string& name) {
  return name == "fp32" ? tutti::DType::f32 : name == "bf16" ? tutti::DType::bf16 : tutti::DType::f16;
}

tutti::amp::Policy precision_policy(const std::string& precision, const std::string& grad_comm) {
  tutti::amp::Policy p = precision == "bf16"   ? tutti::amp::Policy::bf16()
                         : precision == "fp16" ? tutti::amp::Policy::fp16()
                                               : tutti::amp::Policy::fp32();
  if (!grad_comm.empty()) p.comm = dtype_flag(grad_comm);
  return p;
}

std::uint32_t parameters_crc32(const tutti::StateDict& model_state) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& [name, t] : model_state) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(name.data()), static_cast<uInt>(name.size()));
    crc = crc32(crc, static_cast<const Bytef*>(t.data()), static_cast<uInt>(t.nbytes()));
  }
  return static_cast<std::uint32_t>(crc);
}

void warn_if_blas_kernels_are_old(const tutti::Job& job, const char* program) {
  if (job.rank() != 0 || !job.device().is_cpu()) return;
  const std::string warning = tutti::kernels::cpu_blas_info().warning();
  if (!warning.empty()) std::fprintf(stderr, "%s: warning: %s\n", program, warning.c_str());
}

}  // namespace example
