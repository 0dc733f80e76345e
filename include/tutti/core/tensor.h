// Tensor: a reference-counted, contiguous, n-dimensional array on one device.
//
// A Tensor is a handle: copying it shares the storage (like a shared_ptr); use clone() or
// copy_from() for a deep copy. Layout is always contiguous row-major (no strides). A view
// is a Tensor over a range of another one's storage: the reducer places every gradient as a
// view into its bucket, so backward writes straight into the buffer that is communicated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tutti/core/device.h"
#include "tutti/core/dtype.h"
#include "tutti/core/error.h"
#include "tutti/core/stream.h"

namespace tutti {

using Shape = std::vector<std::int64_t>;
// "[2, 3, 4]".
std::string shape_str(const Shape& shape);
// Product of the dimensions (1 for a scalar shape []); throws on a negative dimension.
std::int64_t numel_of(const Shape& shape);

// A block of memory on one device. Freed when the last Tensor using it goes away.
class Storage {
 public:
  // Allocates `nbytes` on `device`: 64-byte aligned host memory (pinned when asked and a
  // GPU is present) or cudaMalloc'ed device memory. Contents are uninitialized.
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, Device device, bool pinned = false);
  // Wraps memory the caller owns; tutti never frees it. The caller keeps it alive.
  static std::shared_ptr<Storage> wrap(void* data, std::size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // Bytes of memory this process holds on `device` in Storages it allocated (pinned host
  // memory counts as the CPU's), right now. Memory reports read it; a benchmark compares it
  // with what a component says it holds.
  static std::int64_t live_bytes(Device device);
  // The most live_bytes(device) has been since the last reset_peak_bytes(device) (since the
  // process started, before any): what a step needed at its worst, e.g. its activations as
  // peak_bytes() - live_bytes() before the forward. reset_peak_bytes sets it to live_bytes().
  static std::int64_t peak_bytes(Device device);
  static void reset_peak_bytes(Device device);

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }

 private:
  Storage(void* data, std::size_t nbytes, Device device, bool owned, bool pinned)
      : data_(data), nbytes_(nbytes), device_(device), owned_(owned), pinned_(pinned) {}
  void* data_;
  std::size_t nbytes_;
  Device device_;
  bool owned_;
  bool pinned_;
};

class Tensor {
 public:
  // An undefined tensor (defined() is false); most operations on it throw.
  Tensor() = default;

  // New storage, uninitialized.
  static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu());
  // New storage, zero-filled (synchronously).
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu());
  // A CPU tensor holding a copy of `values`, converted to `dtype` (rounding to nearest even
  // for halves). values.size() must equal numel(shape).
  static Tensor from_floats(const std::vector<float>& values, Shape shape, DType dtype = DType::f32);
  // A CPU i32 or i64 tensor holding a copy of `values`.
  static Tensor from_ints(const std::vector<std::int64_t>& values, Shape shape, DType dtype = DType::i32);
  // A tensor over memory the caller owns (host or device); tutti never frees it.
  static Tensor wrap(void* data, Shape shape, DType dtype, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  // Size of dimension i; negative i counts from the end (-1 is the last).
  std::int64_t dim(int i) const;
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * size_of(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // Offset of this tensor's first element in its storage, in bytes.
  std::size_t storage_offset_bytes() const { return offset_bytes_; }

  // Pointer to the first element (device memory for GPU tensors).
  void* data() const;
  // Typed pointer; throws InvalidArgument when T does not match dtype().
  template <typename T>
  T* data_as() const {
    TUTTI_CHECK_ARG(defined(), "data_as: undefined tensor");
    TUTTI_CHECK_ARG(dtype_of<T>() == dtype_, "data_as<", name_of(dtype_of<T>()), ">: tensor ", str(), " holds ",
                    name_of(dtype_));
    return static_cast<T*>(data());
  }

  // A view of `shape` starting `offset_elements` elements into this tensor's data, sharing
  // storage. Throws if it would reach past this tensor's end.
  Tensor view(std::int64_t offset_elements, Shape shape) const;
  // This tensor as a flat 1-D view.
  Tensor flatten() const { return view(0, {numel_}); }
  // Same data, another shape with the same number of elements (a view).
  Tensor reshape(Shape shape) const;

  // A new tensor on `device` with a copy of the data. Ordered on `stream`: a copy from or to
  // a GPU is asynchronous when the host side is pinned; call stream.synchronize() before
  // reading the result on the host.
  Tensor to(Device device, const Stream& stream = Stream()) const;
  // A deep copy on the same device.
  Tensor clone(const Stream& stream = Stream()) const;
  // Copies src into this tensor (same dtype and number of elements; any devices).
  void copy_from(const Tensor& src, const Stream& stream = Stream());
  // Sets every byte to zero.
  void zero(const Stream& stream = Stream());

  // The values as floats (any floating dtype; a GPU tensor is copied to the host after all
  // work issued to its device, on every stream, has finished). For tests and printing, not
  // for hot paths: it waits for the whole device.
  std::vector<float> to_floats() const;
  // The values as int64 (i32 or i64 tensors), likewise.
  std::vector<std::int64_t> to_ints() const;

  // True when both tensors are views into the same Storage.
  bool shares_storage_with(const Tensor& other) const { return storage_ != nullptr && storage_ == other.storage_; }
  // "Tensor[2, 3] f32 cpu".
  std::string str() const;

 private:
  Tensor(std::shared_ptr<Storage> storage, std::size_t offset_bytes, Shape shape, DType dtype);
  std::shared_ptr<Storage> storage_;
  std::size_t offset_bytes_ = 0;
  Shape shape_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu();
};

}  // namespace tutti
