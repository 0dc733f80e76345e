// DType: the element types a Tensor can hold, and the host-side half-precision types.
//
// Storage dtypes are f32, f16 and bf16 for values, i32 and i64 for labels and counts.
// Arithmetic always accumulates in fp32, whatever the storage dtype (see docs/architecture.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tutti {

enum class DType : std::uint8_t { f32, f16, bf16, i32, i64 };

// Bytes per element: 4, 2, 2, 4, 8.
std::size_t size_of(DType dtype);
// Short lowercase name: "f32", "f16", "bf16", "i32", "i64".
std::string_view name_of(DType dtype);
// Parses a name as name_of() writes it (also "fp32", "fp16", "float32", "float16",
// "bfloat16", "int32", "int64"); throws tutti::InvalidArgument on anything else.
DType parse_dtype(std::string_view name);
// True for f32, f16 and bf16.
bool is_floating(DType dtype);

// IEEE 754 binary16, stored as its bit pattern. Conversions round to nearest even and
// keep inf and nan (a nan stays a nan, quiet). Layout-compatible with CUDA's __half.
struct Half {
  std::uint16_t bits = 0;
  Half() = default;
  explicit Half(float value);
  explicit operator float() const;
  static Half from_bits(std::uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

// bfloat16 (the top 16 bits of an fp32), stored as its bit pattern. Conversions round to
// nearest even and keep inf and nan. Layout-compatible with CUDA's __nv_bfloat16.
struct BFloat16 {
  std::uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float value);
  explicit operator float() const;
  static BFloat16 from_bits(std::uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

// Scalar conversions, usable on their own (the kernels' CPU reference uses these).
std::uint16_t float_to_half_bits(float value);
float half_bits_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16_bits(float value);
float bf16_bits_to_float(std::uint16_t bits);

// dtype_of<T>(): the DType of a C++ element type (float, Half, BFloat16, int32_t, int64_t).
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::i64;
}

// Converts to and from float for any element type, so CPU kernels can be written once:
// to_float(x) accumulates in fp32; from_float<T>(v) rounds to nearest even for halves.
inline float to_float(float x) { return x; }
inline float to_float(Half x) { return half_bits_to_float(x.bits); }
inline float to_float(BFloat16 x) { return bf16_bits_to_float(x.bits); }
template <typename T>
T from_float(float v);
template <>
inline float from_float<float>(float v) {
  return v;
}
template <>
inline Half from_float<Half>(float v) {
  return Half::from_bits(float_to_half_bits(v));
}
template <>
inline BFloat16 from_float<BFloat16>(float v) {
  return BFloat16::from_bits(float_to_bf16_bits(v));
}

}  // namespace tutti
