#include "tutti/core/dtype.h"

#include <bit>
#include <string>

#include "tutti/core/error.h"

namespace tutti {

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  TUTTI_THROW(InvalidArgument, "size_of: unknown dtype code ", static_cast<int>(dtype));
}

std::string_view name_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "unknown-dtype";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32" || name == "float") return DType::f32;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "half") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "i32" || name == "int32") return DType::i32;
  if (name == "i64" || name == "int64") return DType::i64;
  TUTTI_THROW(InvalidArgument, "parse_dtype: unknown dtype '", std::string(name),
              "' (expected f32, f16, bf16, i32 or i64)");
}

bool is_floating(DType dtype) { return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16; }

static std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
static float float_of(std::uint32_t u) { return std::bit_cast<float>(u); }

std::uint16_t float_to_half_bits(float value) {
  const std::uint32_t x = bits_of(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    const std::uint32_t mant = abs & 0x007fffffu;
    return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? (0x0200u | (mant >> 13)) : 0u));
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Add 0.5 so the float adder itself rounds to nearest even at the 2^-24 quantum.
    const float f = float_of(abs) + 0.5f;
    return static_cast<std::uint16_t>(sign | (bits_of(f) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  const std::uint32_t odd = (abs >> 13) & 1u;
  const std::uint32_t rounded = abs + 0xc8000fffu + odd;  // -(112 << 23) + 0xfff + odd
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t x = bits_of(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // nan: keep the sign, force a quiet nan
    return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  }
  const std::uint32_t odd = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7fffu + odd) >> 16);
}

float bf16_bits_to_float(std::uint16_t bits) { return float_of(static_cast<std::uint32_t>(bits) << 16); }

Half::Half(float value) : bits(float_to_half_bits(value)) {}
Half::operator float() const { return half_bits_to_float(bits); }
BFloat16::BFloat16(float value) : bits(float_to_bf16_bits(value)) {}
BFloat16::operator float() const { return bf16_bits_to_float(bits); }

}  // namespace tutti
