#include "kernels/cpu/rope.h"

#include "kernels/cpu/common.h"
#include "kernels/validate.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// One row's rotated heads, in place; cs holds (cos, sin) of each pair at this row's position.
template <typename T>
void rotate_row(T* x, const float* cs, int64_t heads, int64_t hs, float sign) {
  const int64_t half = hs / 2;
  for (int64_t h = 0; h < heads; ++h) {
    T* a = x + h * hs;
    T* b = a + half;
    for (int64_t i = 0; i < half; ++i) {
      const float c = cs[2 * i], s = sign * cs[2 * i + 1];
      const float va = load_f32(a[i]), vb = load_f32(b[i]);
      a[i] = store_as<T>(va * c - vb * s);
      b[i] = store_as<T>(vb * c + va * s);
    }
  }
}

}  // namespace

void rope_rotate(const Tensor& qkv, const RopeShape& s, const Tensor& table, bool inverse) {
  const float* tab = static_cast<const float*>(table.data());
  const int64_t half = s.hs / 2;
  detail::dispatch_floating("rope", qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* x = static_cast<T*>(qkv.data());
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t t = 0; t < s.T; ++t)
        rotate_row(x + (b * s.T + t) * s.width, tab + t * half * 2, s.rotated_heads, s.hs, inverse ? -1.0f : 1.0f);
  });
}

}  // namespace tutti::kernels::cpu
