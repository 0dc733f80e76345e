// What both safetensors targets do with a file or folder the reader accepted: read every tensor
// whole, in two halves and converted, which must all succeed and agree (the header was validated
// against the file), and refuse the dtypes tutti does not hold.
#pragma once

#include <cstdlib>
#include <cstring>

#include "tutti/io/safetensors.h"

namespace tutti::fuzz {

template <typename Reader>
void read_everything(const Reader& reader, const io::SafetensorsEntry& e) {
  if (!e.tutti_dtype) {
    try {
      reader.read(e.name);
    } catch (const InvalidArgument&) {
      return;
    }
    std::abort();  // a dtype tutti does not hold was read
  }
  const Tensor whole = reader.read(e.name);
  if (whole.shape() != e.shape || whole.dtype() != *e.tutti_dtype || whole.nbytes() != e.nbytes()) std::abort();
  const std::int64_t n = e.numel(), half = n / 2;
  const Tensor tail = reader.read_elements(e.name, half, n - half);
  const std::size_t element = size_of(whole.dtype());
  if (tail.nbytes() > 0 &&
      std::memcmp(tail.data(), static_cast<const char*>(whole.data()) + half * element, tail.nbytes()) != 0) {
    std::abort();
  }
  if (is_floating(whole.dtype()) && whole.dtype() != DType::f32) {
    const std::vector<float> got = reader.read(e.name, DType::f32).to_floats();
    const std::vector<float> want = whole.to_floats();
    if (got.size() != want.size() ||
        (!got.empty() && std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0)) {
      std::abort();
    }
  }
}

}  // namespace tutti::fuzz
