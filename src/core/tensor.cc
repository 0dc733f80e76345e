#include "tutti/core/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/gpu_runtime.h"

namespace tutti {

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    TUTTI_CHECK_ARG(d >= 0, "shape ", shape_str(shape), " has a negative dimension");
    n *= d;
  }
  return n;
}

// ---- Storage ---------------------------------------------------------------------------

namespace {
// Live bytes per device: [0] the CPU, [1 + i] GPU i (GPUs past the table share its last slot).
constexpr int kTrackedDevices = 17;
std::atomic<std::int64_t> live[kTrackedDevices];
std::atomic<std::int64_t> peak[kTrackedDevices];
int slot_of(Device d) { return d.is_cpu() ? 0 : std::min(1 + std::max(d.index, 0), kTrackedDevices - 1); }
std::atomic<std::int64_t>& live_slot(Device d) { return live[slot_of(d)]; }

// Adds `nbytes` to the device's live bytes and raises its peak to the new total.
void add_live(Device d, std::int64_t nbytes) {
  const std::int64_t now = live_slot(d).fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  std::atomic<std::int64_t>& p = peak[slot_of(d)];
  std::int64_t seen = p.load(std::memory_order_relaxed);
  while (seen < now && !p.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}
}  // namespace

std::int64_t Storage::live_bytes(Device device) { return live_slot(device).load(std::memory_order_relaxed); }

std::int64_t Storage::peak_bytes(Device device) { return peak[slot_of(device)].load(std::memory_order_relaxed); }

void Storage::reset_peak_bytes(Device device) {
  peak[slot_of(device)].store(live_bytes(device), std::memory_order_relaxed);
}

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Device device, bool pinned) {
  device.require_available();
  void* p = nullptr;
  if (device.is_cuda()) {
    p = gpu::malloc_device(nbytes, device.index);
    pinned = false;
  } else if (pinned && gpu::device_count() > 0) {
    p = gpu::malloc_pinned(nbytes);
  } else {
    pinned = false;
    // 64-byte alignment: whole cache lines, and 16-byte vector loads are always aligned.
    const std::size_t rounded = ((nbytes + 63) / 64) * 64;
    p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (p == nullptr) {
      TUTTI_THROW(BackendError, "out of host memory allocating ", nbytes, " bytes");
    }
  }
  if (p != nullptr) add_live(device, static_cast<std::int64_t>(nbytes));
  return std::shared_ptr<Storage>(new Storage(p, nbytes, device, /*owned=*/true, pinned));
}

std::shared_ptr<Storage> Storage::wrap(void* data, std::size_t nbytes, Device device) {
  TUTTI_CHECK_ARG(data != nullptr || nbytes == 0, "Storage::wrap: null pointer for ", nbytes, " bytes");
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, /*owned=*/false, false));
}

Storage::~Storage() {
  if (!owned_ || data_ == nullptr) return;
  live_slot(device_).fetch_sub(static_cast<std::int64_t>(nbytes_), std::memory_order_relaxed);
  if (device_.is_cuda()) {
    gpu::free_device(data_, device_.index);
  } else if (pinned_) {
    gpu::free_pinned(data_);
  } else {
    std::free(data_);
  }
}

// ---- Tensor ----------------------------------------------------------------------------

namespace {
// A host copy of a GPU tensor after ALL work on its device: the values may come from a kernel
// on any stream (tutti's streams do not synchronize with the default stream), and reading
// them for a test or a printout must not race with it.
Tensor synchronized_host_copy(const Tensor& t) {
  gpu::set_device(t.device().index);
  gpu::device_synchronize();
  return t.to(Device::cpu());
}
}  // namespace

Tensor::Tensor(std::shared_ptr<Storage> storage, std::size_t offset_bytes, Shape shape, DType dtype)
    : storage_(std::move(storage)),
      offset_bytes_(offset_bytes),
      shape_(std::move(shape)),
      numel_(numel_of(shape_)),
      dtype_(dtype),
      device_(storage_->device()) {}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  const std::int64_t n = numel_of(shape);
  auto storage = Storage::allocate(static_cast<std::size_t>(n) * size_of(dtype), device);
  return Tensor(std::move(storage), 0, std::move(shape), dtype);
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  Stream s = device.is_cuda() ? Stream::default_for(device) : Stream();
  t.zero(s);
  s.synchronize();
  return t;
}

Tensor Tensor::from_floats(const std::vector<float>& values, Shape shape, DType dtype) {
  TUTTI_CHECK_ARG(is_floating(dtype), "Tensor::from_floats: dtype ", name_of(dtype), " is not floating");
  TUTTI_ENFORCE_EQ(static_cast<std::int64_t>(values.size()), numel_of(shape), "Tensor::from_floats: values for shape ",
                   shape_str(shape));
  Tensor t = empty(std::move(shape), dtype);
  // The pointer and the dtype's case outside the loops (here and below): tests convert megabytes
  // through these, and data() per element was a call and a check each.
  switch (dtype) {
    case DType::f32: std::copy(values.begin(), values.end(), t.data_as<float>()); break;
    case DType::f16:
      std::transform(values.begin(), values.end(), t.data_as<Half>(), [](float v) { return Half(v); });
      break;
    case DType::bf16:
      std::transform(values.begin(), values.end(), t.data_as<BFloat16>(), [](float v) { return BFloat16(v); });
      break;
    default: break;
  }
  return t;
}

Tensor Tensor::from_ints(const std::vector<std::int64_t>& values, Shape shape, DType dtype) {
  TUTTI_CHECK_ARG(dtype == DType::i32 || dtype == DType::i64, "Tensor::from_ints: dtype ", name_of(dtype),
                  " is not an integer type");
  TUTTI_ENFORCE_EQ(static_cast<std::int64_t>(values.size()), numel_of(shape), "Tensor::from_ints: values for shape ",
                   shape_str(shape));
  Tensor t = empty(std::move(shape), dtype);
  if (dtype == DType::i32) {
    std::transform(values.begin(), values.end(), t.data_as<std::int32_t>(),
                   [](std::int64_t v) { return static_cast<std::int32_t>(v); });
  } else {
    std::copy(values.begin(), values.end(), t.data_as<std::int64_t>());
  }
  return t;
}

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, Device device) {
  const std::size_t nbytes = static_cast<std::size_t>(numel_of(shape)) * size_of(dtype);
  return Tensor(Storage::wrap(data, nbytes, device), 0, std::move(shape), dtype);
}

std::int64_t Tensor::dim(int i) const {
  const int n = ndim();
  const int k = i < 0 ? i + n : i;
  TUTTI_CHECK_ARG(k >= 0 && k < n, "Tensor::dim(", i, ") out of range for ", str());
  return shape_[k];
}

void* Tensor::data() const {
  TUTTI_CHECK_ARG(defined(), "data: undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

Tensor Tensor::view(std::int64_t offset_elements, Shape shape) const {
  TUTTI_CHECK_ARG(defined(), "view: undefined tensor");
  const std::int64_t n = numel_of(shape);
  TUTTI_CHECK_ARG(offset_elements >= 0 && offset_elements + n <= numel_, "view: elements [", offset_elements, ", ",
                  offset_elements + n, ") reach past the end of ", str());
  return Tensor(storage_, offset_bytes_ + static_cast<std::size_t>(offset_elements) * size_of(dtype_), std::move(shape),
                dtype_);
}

Tensor Tensor::reshape(Shape shape) const {
  TUTTI_ENFORCE_EQ(numel_of(shape), numel_, "reshape of ", str(), " to ", shape_str(shape));
  return view(0, std::move(shape));
}

Tensor Tensor::to(Device device, const Stream& stream) const {
  TUTTI_CHECK_ARG(defined(), "to: undefined tensor");
  Tensor out = empty(shape_, dtype_, device);
  out.copy_from(*this, stream);
  return out;
}

Tensor Tensor::clone(const Stream& stream) const { return to(device_, stream); }

void Tensor::copy_from(const Tensor& src, const Stream& stream) {
  TUTTI_CHECK_ARG(defined() && src.defined(), "copy_from: undefined tensor");
  TUTTI_CHECK_ARG(src.dtype_ == dtype_, "copy_from: dtype ", name_of(src.dtype_), " into ", name_of(dtype_));
  TUTTI_ENFORCE_EQ(src.numel_, numel_, "copy_from: ", src.str(), " into ", str());
  if (nbytes() == 0) return;
  if (device_.is_cpu() && src.device_.is_cpu()) {
    std::memmove(data(), src.data(), nbytes());
    return;
  }
  // A GPU is involved: CUDA orders the copy on the stream (UVA tells the direction).
  if (stream.device().is_cuda()) {
    gpu::memcpy_async(data(), src.data(), nbytes(), stream.native());
  } else {
    // Asked on the CPU stream: be synchronous, as CPU work is.
    gpu::memcpy_async(data(), src.data(), nbytes(), nullptr);
    gpu::stream_synchronize(nullptr);
  }
}

void Tensor::zero(const Stream& stream) {
  TUTTI_CHECK_ARG(defined(), "zero: undefined tensor");
  if (device_.is_cpu()) {
    std::memset(data(), 0, nbytes());
  } else {
    gpu::memset_async(data(), 0, nbytes(), stream.device().is_cuda() ? stream.native() : nullptr);
    if (!stream.device().is_cuda()) gpu::stream_synchronize(nullptr);
  }
}

std::vector<float> Tensor::to_floats() const {
  TUTTI_CHECK_ARG(defined() && is_floating(dtype_), "to_floats: needs a floating tensor, got ", str());
  const Tensor host = device_.is_cpu() ? *this : synchronized_host_copy(*this);
  std::vector<float> out(static_cast<std::size_t>(numel_));
  const auto convert = [&](const auto* in) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = to_float(in[i]);
  };
  switch (dtype_) {
    case DType::f32: std::copy_n(host.data_as<float>(), out.size(), out.begin()); break;
    case DType::f16: convert(host.data_as<Half>()); break;
    case DType::bf16: convert(host.data_as<BFloat16>()); break;
    default: break;
  }
  return out;
}

std::vector<std::int64_t> Tensor::to_ints() const {
  TUTTI_CHECK_ARG(defined() && (dtype_ == DType::i32 || dtype_ == DType::i64),
                  "to_ints: needs an i32 or i64 tensor, got ", str());
  const Tensor host = device_.is_cpu() ? *this : synchronized_host_copy(*this);
  std::vector<std::int64_t> out(static_cast<std::size_t>(numel_));
  if (dtype_ == DType::i32) {
    std::copy_n(host.data_as<std::int32_t>(), out.size(), out.begin());
  } else {
    std::copy_n(host.data_as<std::int64_t>(), out.size(), out.begin());
  }
  return out;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor" + shape_str(shape_) + " " + std::string(name_of(dtype_)) + " " + device_.str();
}

}  // namespace tutti
