// Input checks and dtype dispatch shared by the kernel families' public functions.
// Internal header. Every failure is an InvalidArgument that starts with the op's name.
#pragma once

#include <initializer_list>
#include <utility>

#include "tutti/core/dtype.h"
#include "tutti/core/error.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::detail {

// `name` must be a defined tensor.
inline void require_defined(const char* op, const char* name, const Tensor& t) {
  TUTTI_CHECK_ARG(t.defined(), op, ": ", name, " is required but undefined");
}

// `name` must be f32, f16 or bf16.
inline void require_floating(const char* op, const char* name, const Tensor& t) {
  require_defined(op, name, t);
  TUTTI_CHECK_ARG(is_floating(t.dtype()), op, ": ", name, " must be f32, f16 or bf16, got ", t.str());
}

inline void require_dtype(const char* op, const char* name, const Tensor& t, DType dtype) {
  require_defined(op, name, t);
  TUTTI_CHECK_ARG(t.dtype() == dtype, op, ": ", name, " must be ", name_of(dtype), ", got ", t.str());
}

// `name` must be defined and of `dtype` or f32: gradients and outputs that may be kept in fp32
// buffers when the values are f16/bf16.
inline void require_dtype_or_f32(const char* op, const char* name, const Tensor& t, DType dtype) {
  require_defined(op, name, t);
  TUTTI_CHECK_ARG(t.dtype() == dtype || t.dtype() == DType::f32, op, ": ", name, " must be ", name_of(dtype),
                  " or f32, got ", t.str());
}

inline void require_shape(const char* op, const char* name, const Tensor& t, const Shape& shape) {
  require_defined(op, name, t);
  TUTTI_CHECK_ARG(t.shape() == shape, op, ": ", name, " must have shape ", shape_str(shape), ", got ", t.str());
}

inline void require_same_numel(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                               const Tensor& b) {
  TUTTI_CHECK_ARG(a.numel() == b.numel(), op, ": ", a_name, " ", a.str(), " and ", b_name, " ", b.str(),
                  " must have the same number of elements");
}

// Every defined tensor lives on the same device, and the stream (when it is a GPU stream)
// is on that device too. Returns that device.
inline Device require_same_device(const char* op, std::initializer_list<const Tensor*> tensors, const Stream& stream) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (first == nullptr) {
      first = t;
      continue;
    }
    TUTTI_CHECK_ARG(t->device() == first->device(), op, ": tensors on different devices: ", first->str(), " and ",
                    t->str());
  }
  TUTTI_CHECK_ARG(first != nullptr, op, ": no tensor given");
  const Device d = first->device();
  TUTTI_CHECK_ARG(stream.device().is_cpu() || stream.device() == d, op, ": stream on ", stream.device().str(),
                  " but tensors on ", d.str());
  return d;
}

// Calls f(T{}) with T the host element type of a floating dtype (float, Half, BFloat16).
template <typename F>
decltype(auto) dispatch_floating(const char* op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return std::forward<F>(f)(float{});
    case DType::f16: return std::forward<F>(f)(Half{});
    case DType::bf16: return std::forward<F>(f)(BFloat16{});
    default: break;
  }
  TUTTI_THROW(InvalidArgument, op, ": dtype ", name_of(dtype), " is not a floating dtype");
}

}  // namespace tutti::kernels::detail
