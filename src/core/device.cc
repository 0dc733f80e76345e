#include "tutti/core/device.h"

#include <charconv>
#include <string>

#include "core/gpu_runtime.h"
#include "tutti/core/error.h"

namespace tutti {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda" || text == "gpu") return cuda(0);
  if (text.starts_with("cuda:")) {
    const std::string_view digits = text.substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0) return cuda(index);
  }
  TUTTI_THROW(InvalidArgument, "Device::parse: '", std::string(text),
              "' is not a device (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index); }

void Device::require_available() const {
  if (is_cpu()) return;
  TUTTI_CHECK_ARG(gpu::built_with_cuda(), "device ", str(),
                  " requested, but libtutti was built without CUDA (TUTTI_WITH_CUDA=OFF)");
  const int n = gpu::device_count();
  TUTTI_CHECK_ARG(n > 0, "device ", str(),
                  " requested, but no GPU is visible to this process "
                  "(no GPU or no driver; CUDA_VISIBLE_DEVICES may hide them)");
  TUTTI_CHECK_ARG(index >= 0 && index < n, "device ", str(), " requested, but only ", n,
                  " GPU(s) are visible (cuda:0..cuda:", n - 1, ")");
}

bool cuda_available() { return gpu::device_count() > 0; }
int cuda_device_count() { return gpu::device_count(); }
bool built_with_cuda() { return gpu::built_with_cuda(); }
std::string cuda_runtime_version() { return gpu::runtime_version(); }
std::string cuda_driver_version() { return gpu::driver_version(); }

std::string device_description(Device device) {
  if (device.is_cpu()) return "cpu";
  device.require_available();
  return gpu::device_name(device.index) + " (sm_" + std::to_string(gpu::compute_capability(device.index)) + ")";
}

}  // namespace tutti
