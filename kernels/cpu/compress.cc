// CPU block quantization, the reference of the CUDA twin: the same f32 operations in the same
// order (absmax, one division by the scale, round to nearest even, one multiplication back),
// so the two give the same bits. Compiled with -ffp-contract=off (kernels/CMakeLists.txt): a
// fused multiply-add would round differently from the GPU's explicit __fmul_rn / __fadd_rn.
#include "kernels/cpu/compress.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// The integer code of v in a block of scale s (s = 0: the block is all zeros).
inline int quantize_one(float v, float s, int qmax) {
  if (s == 0.0f) return 0;
  const float r = std::nearbyint(v / s);  // ties to even, in the default rounding mode
  return r > static_cast<float>(qmax) ? qmax : (r < static_cast<float>(-qmax) ? -qmax : static_cast<int>(r));
}

// Sign-extends the nibble of a 4-bit code.
inline int unpack_nibble(unsigned nibble) { return static_cast<int>(nibble ^ 8u) - 8; }

}  // namespace

void quantize_blocks(const Tensor& x, int bits, int64_t block, const Tensor& q, const Tensor& scales,
                     const Tensor& residual) {
  const int64_t n = x.numel();
  const float* xp = x.data_as<float>();
  float* rp = residual.defined() ? residual.data_as<float>() : nullptr;
  auto* bytes = static_cast<unsigned char*>(q.data());
  float* sp = scales.data_as<float>();
  const int qmax = bits == 8 ? 127 : 7;
  std::vector<float> v(static_cast<std::size_t>(block));
  for (int64_t b = 0, start = 0; start < n; ++b, start += block) {
    const int64_t len = std::min(block, n - start);
    float absmax = 0.0f;
    for (int64_t j = 0; j < len; ++j) {
      v[j] = rp != nullptr ? xp[start + j] + rp[start + j] : xp[start + j];
      absmax = std::fmax(absmax, std::fabs(v[j]));
    }
    const float s = absmax / static_cast<float>(qmax);
    sp[b] = s;
    for (int64_t j = 0; j < len; ++j) {
      const int code = quantize_one(v[j], s, qmax);
      if (bits == 8) {
        bytes[start + j] = static_cast<unsigned char>(static_cast<signed char>(code));
      } else {
        // block is even, so start is even and (start + j) / 2 is this pair's byte.
        const int64_t k = (start + j) / 2;
        const auto nib = static_cast<unsigned char>(code & 0xf);
        bytes[k] = (j % 2 == 0) ? nib : static_cast<unsigned char>(bytes[k] | (nib << 4));
      }
      if (rp != nullptr) rp[start + j] = v[j] - static_cast<float>(code) * s;
    }
  }
  // The bytes past the last value, up to the end of the last word.
  const int64_t used = bits == 8 ? n : (n + 1) / 2;
  std::memset(bytes + used, 0, static_cast<std::size_t>(q.nbytes() - used));
}

void dequantize_blocks(const Tensor& q, const Tensor& scales, int bits, int64_t block, const Tensor& out,
                       bool accumulate) {
  const int64_t n = out.numel();
  const auto* bytes = static_cast<const unsigned char*>(q.data());
  const float* sp = scales.data_as<float>();
  float* op = out.data_as<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int code = bits == 8 ? static_cast<int>(static_cast<signed char>(bytes[i]))
                               : unpack_nibble((bytes[i / 2] >> ((i % 2) * 4)) & 0xfu);
    const float d = static_cast<float>(code) * sp[i / block];
    op[i] = accumulate ? op[i] + d : d;
  }
}

}  // namespace tutti::kernels::cpu
