// Device: where a tensor lives and where its kernels run, the CPU or one CUDA GPU.
//
// A build with CUDA also runs on a machine without a GPU: cuda_available() is false there,
// and every program falls back to the CPU (Device::cpu()).
#pragma once

#include <string>
#include <string_view>

namespace tutti {

enum class DeviceType : unsigned char { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // GPU ordinal for cuda (as CUDA numbers them, after CUDA_VISIBLE_DEVICES); 0 for cpu

  static constexpr Device cpu() { return Device{DeviceType::cpu, 0}; }
  static constexpr Device cuda(int index = 0) { return Device{DeviceType::cuda, index}; }
  // Parses "cpu", "cuda" (= cuda:0) or "cuda:N"; throws InvalidArgument otherwise.
  // Does not check that the GPU exists: see require_available().
  static Device parse(std::string_view text);

  constexpr bool is_cpu() const { return type == DeviceType::cpu; }
  constexpr bool is_cuda() const { return type == DeviceType::cuda; }
  // "cpu" or "cuda:N".
  std::string str() const;
  // Throws InvalidArgument if this is a GPU that the process cannot use (no GPU, no CUDA
  // in this build, or an index past the visible GPUs).
  void require_available() const;

  friend constexpr bool operator==(Device a, Device b) {
    return a.type == b.type && (a.type == DeviceType::cpu || a.index == b.index);
  }
};

// True when this build has CUDA and the process sees at least one GPU. Never throws: a
// missing driver or GPU reads as false. The answer is computed once and cached.
bool cuda_available();
// Number of GPUs this process sees (0 when none, or when the build has no CUDA).
int cuda_device_count();
// True when libtutti was compiled with CUDA (whether or not a GPU is present).
bool built_with_cuda();
// Versions as "13.0", or "none": the CUDA runtime tutti was built against and the driver's.
std::string cuda_runtime_version();
std::string cuda_driver_version();
// The GPU's name and compute capability, "NVIDIA H200 (sm_90)"; "cpu" for the CPU.
std::string device_description(Device device);

}  // namespace tutti
