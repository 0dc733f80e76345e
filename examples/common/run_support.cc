#include "run_support.h"

#include <zlib.h>

#include <algorithm>
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

std::string CheckpointLog::observe(const tutti::train::StepEnd& end) {
  char text[256];
  if (end.snapshot) snapshot_stalls_.push_back(end.snapshot_seconds);
  if (end.snapshot && snapshot_stalls_.size() == 1) {
    // The first snapshot: what it cost, and the interval (--snapshot-every auto chose it now).
    snapshot_every_ = end.snapshot_every;
    std::snprintf(text, sizeof text, "memory snapshots: every %lld steps (one took %.1f ms)",
                  static_cast<long long>(end.snapshot_every), end.snapshot_seconds * 1e3);
    return text;
  }
  if (!end.checkpoint) return "";
  stalls_.push_back(end.checkpoint_seconds);
  if (end.checkpoint_skipped) {
    ++skipped_;
    std::snprintf(text, sizeof text, "checkpoint of step %lld skipped: the one of step %lld is still being written",
                  static_cast<long long>(end.step), static_cast<long long>(end.checkpoint_busy_step));
    return text;
  }
  if (end.checkpoint_busy_step >= 0 && end.checkpoint_waited_seconds > 0) {
    std::snprintf(text, sizeof text, "checkpoint of step %lld waited %.2f s for the write of step %lld",
                  static_cast<long long>(end.step), end.checkpoint_waited_seconds,
                  static_cast<long long>(end.checkpoint_busy_step));
    return text;
  }
  return "";
}

void CheckpointLog::summarize(tutti::train::Summary& summary) const {
  std::vector<double> m = snapshot_stalls_;
  std::sort(m.begin(), m.end());
  summary.set("snapshots", static_cast<std::int64_t>(m.size()));
  summary.set("snapshot_every", snapshot_every_);
  if (m.empty()) {
    summary.set_null("snapshot_stall_median_s");
  } else {
    summary.set("snapshot_stall_median_s", m[m.size() / 2]);
  }
  summary.set("checkpoints", static_cast<std::int64_t>(stalls_.size()));
  summary.set("checkpoints_skipped", skipped_);
  std::vector<double> s = stalls_;
  std::sort(s.begin(), s.end());
  if (s.empty()) {
    summary.set_null("checkpoint_stall_median_s");
    summary.set_null("checkpoint_stall_max_s");
    return;
  }
  summary.set("checkpoint_stall_median_s", s[s.size() / 2]);
  summary.set("checkpoint_stall_max_s", s.back());
}

}  // namespace example
