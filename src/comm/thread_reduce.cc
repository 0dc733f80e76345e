// The arithmetic of the thread backend (see thread_reduce.h).
#include "comm/thread_reduce.h"

#include <algorithm>

namespace tutti::detail {
namespace {

float load(const Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return static_cast<const float*>(t.data())[i];
    case DType::f16: return half_bits_to_float(static_cast<const std::uint16_t*>(t.data())[i]);
    case DType::bf16: return bf16_bits_to_float(static_cast<const std::uint16_t*>(t.data())[i]);
    default: return 0;
  }
}

void store(std::vector<char>& out, DType dtype, std::int64_t i, float v) {
  switch (dtype) {
    case DType::f32: reinterpret_cast<float*>(out.data())[i] = v; break;
    case DType::f16: reinterpret_cast<std::uint16_t*>(out.data())[i] = float_to_half_bits(v); break;
    case DType::bf16: reinterpret_cast<std::uint16_t*>(out.data())[i] = float_to_bf16_bits(v); break;
    default: break;
  }
}

std::int64_t load_int(const Tensor& t, std::int64_t i) {
  return t.dtype() == DType::i32 ? static_cast<const std::int32_t*>(t.data())[i]
                                 : static_cast<const std::int64_t*>(t.data())[i];
}

void store_int(std::vector<char>& out, DType dtype, std::int64_t i, std::int64_t v) {
  if (dtype == DType::i32) {
    reinterpret_cast<std::int32_t*>(out.data())[i] = static_cast<std::int32_t>(v);
  } else {
    reinterpret_cast<std::int64_t*>(out.data())[i] = v;
  }
}

}  // namespace

// op over ranks of elements [first, first + n) of every input, into `out` (n elements).
void reduce(const std::vector<Tensor>& inputs, ReduceOp op, DType dtype, std::int64_t first, std::int64_t n,
            std::vector<char>& out) {
  out.assign(static_cast<std::size_t>(n) * size_of(dtype), 0);
  const bool floating = is_floating(dtype);
  const int ranks = static_cast<int>(inputs.size());
  for (std::int64_t i = 0; i < n; ++i) {
    if (floating) {
      float acc = load(inputs[0], first + i);
      for (int r = 1; r < ranks; ++r) {
        const float v = load(inputs[static_cast<std::size_t>(r)], first + i);
        acc = op == ReduceOp::max ? std::max(acc, v) : op == ReduceOp::min ? std::min(acc, v) : acc + v;
      }
      if (op == ReduceOp::avg) acc /= static_cast<float>(ranks);
      store(out, dtype, i, acc);
    } else {
      std::int64_t acc = load_int(inputs[0], first + i);
      for (int r = 1; r < ranks; ++r) {
        const std::int64_t v = load_int(inputs[static_cast<std::size_t>(r)], first + i);
        acc = op == ReduceOp::max ? std::max(acc, v) : op == ReduceOp::min ? std::min(acc, v) : acc + v;
      }
      store_int(out, dtype, i, acc);
    }
  }
}

}  // namespace tutti::detail
