// What the example trainers (train_fashion_mnist, train_gpt) share beyond the library: the
// precision flags, the parameters' checksum their JSON reports, start-up warnings. (Their
// shared flags: run_flags.h; run control: tutti::train::Run.)
#pragma once

#include <cstdint>
#include <string>

#include <tutti/tutti.h>

namespace example {

// "fp32", "bf16" or "fp16" (the flags' values, checked by CLI11) as a DType.
tutti::DType dtype_flag(const std::string& name);

// The amp policy of --precision, with --grad-comm (empty: the precision's own) as the dtype
// gradients travel in.
tutti::amp::Policy precision_policy(const std::string& precision, const std::string& grad_comm);

// crc32 of every tensor's name and bytes, in name order: equal runs hold bit-identical models.
std::uint32_t parameters_crc32(const tutti::StateDict& model_state);

// Rank 0 of a job on the CPU: prints "<program>: warning: ..." to stderr when OpenBLAS runs
// kernels older than the CPU (tutti::kernels::cpu_blas_info()).
void warn_if_blas_kernels_are_old(const tutti::Job& job, const char* program);

}  // namespace example
