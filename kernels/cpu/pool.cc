// CPU 2x2 max-pooling, stride 2 (declared in kernels/cpu/conv.h). The rule of every path: a
// window's max is its first maximum in row-major order (strict >), and a nan wins over numbers,
// so a nan input shows up in the output as in PyTorch; backward sends dy to that element.
//
// Paths, per plane [H, W]:
// - f32 on a CPU with AVX-512: a row pair at a time, in chunks of 16 columns masked at the
//   row's end, so that the CNN's short rows (28 and 14 columns: 14 and 7 windows) run as
//   vectors too. The generic row loop below does not vectorize them (its vector body needs 16
//   windows), and ran backward 6x slower than forward. The strict > chain runs in the even
//   lanes; backward routes dy with lane masks. A plane holding a nan is redone by the general path.
// - f32 otherwise: row loops of selects that GCC vectorizes (wider clones: common.h).
// - halves, and planes with a nan: the general per-window loop (argmax4).
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/conv.h"
#include "kernels/validate.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TUTTI_POOL_AVX512 1
#else
#define TUTTI_POOL_AVX512 0
#endif

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// Index (0..3, row-major in the window) of the max of a 2x2 window: the first one on ties;
// a nan wins over numbers, so a nan input shows up in the output as it does in PyTorch.
inline int argmax4(const float v[4]) {
  int best = 0;
  float bv = v[0];
  for (int i = 1; i < 4; ++i) {
    // Written as selects (no data-dependent branch): random data would mispredict half the time.
    const bool take = v[i] > bv || (v[i] != v[i] && bv == bv);
    best = take ? i : best;
    bv = take ? v[i] : bv;
  }
  return best;
}

// True when n f32 values hold a nan (then the general, nan-aware path runs). Written on the
// bit patterns (a nan's magnitude bits exceed inf's) as a max reduction, which
// vectorizes; a bool "any" does not.
inline bool has_nan(const float* p, int64_t n) {
  std::uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const std::uint32_t magnitude = bits_of(p[i]) & 0x7fffffffu;
    largest = magnitude > largest ? magnitude : largest;
  }
  return largest > 0x7f800000u;
}

// f32 rows without nan: the same first-max rule as argmax4, as selects that vectorize.
inline void maxpool_forward_rows_f32(const float* __restrict r0, const float* __restrict r1, float* __restrict out,
                                     int64_t wo) {
  for (int64_t j = 0; j < wo; ++j) {
    float m = r0[2 * j];
    m = r0[2 * j + 1] > m ? r0[2 * j + 1] : m;
    m = r1[2 * j] > m ? r1[2 * j] : m;
    m = r1[2 * j + 1] > m ? r1[2 * j + 1] : m;
    out[j] = m;
  }
}
inline void maxpool_backward_rows_f32(const float* __restrict r0, const float* __restrict r1,
                                      const float* __restrict dy, float* __restrict d0, float* __restrict d1,
                                      int64_t wo) {
  for (int64_t j = 0; j < wo; ++j) {
    const float a = r0[2 * j], b = r0[2 * j + 1], c = r1[2 * j], d = r1[2 * j + 1];
    float m = a;
    m = b > m ? b : m;
    m = c > m ? c : m;
    m = d > m ? d : m;
    // The first element equal to the max is the one the strict-> chain of argmax4 picks: the
    // gradient goes to it, and `rest` (what is still to be given) drops to 0. Float selects
    // only, so the loop vectorizes.
    const float g = dy[j];
    const float ga = a == m ? g : 0.0f;
    float rest = a == m ? 0.0f : g;
    const float gb = b == m ? rest : 0.0f;
    rest = b == m ? 0.0f : rest;
    const float gc = c == m ? rest : 0.0f;
    rest = c == m ? 0.0f : rest;
    d0[2 * j] = ga;
    d0[2 * j + 1] = gb;
    d1[2 * j] = gc;
    d1[2 * j + 1] = rest;
  }
}

// One f32 plane [h, w] when it holds no nan (checked once per plane: rows are short, and a
// per-row scan cost as much as the pooling); returns false, writing nothing, when it does.
// Compiled for wider vector units too (common.h): the selects and the even/odd shuffles are
// much shorter with SSE4.1 / AVX than in baseline SSE2.
TUTTI_CPU_SIMD_CLONES bool maxpool_forward_plane_f32(const float* x, float* y, int64_t h, int64_t w) {
  const int64_t ho = h / 2, wo = w / 2;
  if (has_nan(x, 2 * ho * w)) return false;
  for (int64_t i = 0; i < ho; ++i) maxpool_forward_rows_f32(x + 2 * i * w, x + (2 * i + 1) * w, y + i * wo, wo);
  return true;
}
TUTTI_CPU_SIMD_CLONES bool maxpool_backward_plane_f32(const float* x, const float* dy, float* dx, int64_t h,
                                                      int64_t w) {
  const int64_t ho = h / 2, wo = w / 2;
  if (has_nan(x, 2 * ho * w)) return false;
  for (int64_t i = 0; i < ho; ++i)
    maxpool_backward_rows_f32(x + 2 * i * w, x + (2 * i + 1) * w, dy + i * wo, dx + 2 * i * w, dx + (2 * i + 1) * w,
                              wo);
  return true;
}

#if TUTTI_POOL_AVX512
#define TUTTI_AVX512 __attribute__((target("avx512f")))

bool have_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

// The even lanes of a 16-lane mask.
constexpr __mmask16 kEven = 0x5555;
// Every lane (the maskz forms: the plain permutes of GCC 12 warn of an uninitialized operand).
constexpr __mmask16 kAll = 0xFFFF;

// One chunk of at most 16 columns (an even number, `cols`) of a row pair r0 / r1. Seen from
// an even lane, its window is a = top, b = top_next, c = bottom, d = bottom_next.
struct Chunk {
  __m512 top, bottom, top_next, bottom_next;  // *_next: the odd lane's value moved to the even lane
  __mmask16 load;                             // the lanes that exist
};
TUTTI_AVX512 inline Chunk load_chunk(const float* r0, const float* r1, int64_t cols) {
  Chunk k;
  k.load = static_cast<__mmask16>((1u << cols) - 1u);
  k.top = _mm512_maskz_loadu_ps(k.load, r0);
  k.bottom = _mm512_maskz_loadu_ps(k.load, r1);
  k.top_next = _mm512_maskz_permute_ps(kAll, k.top, 0xB1);  // lanes [1, 0, 3, 2, ...]
  k.bottom_next = _mm512_maskz_permute_ps(kAll, k.bottom, 0xB1);
  return k;
}

// The strict > chain a, b, c, d of argmax4 in the even lanes: the max, and where b, c, d took over.
struct Chain {
  __m512 max;
  __mmask16 took_b, took_c, took_d;
};
TUTTI_AVX512 inline Chain chain(const Chunk& k) {
  Chain ch;
  __m512 m = k.top;
  ch.took_b = _mm512_cmp_ps_mask(k.top_next, m, _CMP_GT_OQ);
  m = _mm512_mask_mov_ps(m, ch.took_b, k.top_next);
  ch.took_c = _mm512_cmp_ps_mask(k.bottom, m, _CMP_GT_OQ);
  m = _mm512_mask_mov_ps(m, ch.took_c, k.bottom);
  ch.took_d = _mm512_cmp_ps_mask(k.bottom_next, m, _CMP_GT_OQ);
  ch.max = _mm512_mask_mov_ps(m, ch.took_d, k.bottom_next);
  return ch;
}

TUTTI_AVX512 inline bool chunk_has_nan(const Chunk& k) {
  return _mm512_mask_cmp_ps_mask(k.load, k.top, k.bottom, _CMP_UNORD_Q) != 0;
}

inline __mmask16 low_lanes(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

// One f32 plane; returns false, with the plane partly written, when it holds a nan (the caller
// then redoes it on the general path).
TUTTI_AVX512 bool maxpool_forward_plane_avx512(const float* x, float* y, int64_t h, int64_t w) {
  const int64_t ho = h / 2, wo = w / 2;
  const __m512i evens = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 14, 12, 10, 8, 6, 4, 2, 0);
  for (int64_t i = 0; i < ho; ++i) {
    const float* r0 = x + 2 * i * w;
    const float* r1 = r0 + w;
    float* out = y + i * wo;
    for (int64_t c = 0; c < w; c += 16) {
      const int64_t cols = w - c < 16 ? w - c : 16;
      const Chunk k = load_chunk(r0 + c, r1 + c, cols);
      if (chunk_has_nan(k)) return false;
      // The windows' maxima, packed from the even lanes into the low ones, in order.
      const __m512 packed = _mm512_maskz_permutexvar_ps(kAll, evens, chain(k).max);
      _mm512_mask_storeu_ps(out + c / 2, low_lanes(cols / 2), packed);
    }
  }
  return true;
}

TUTTI_AVX512 bool maxpool_backward_plane_avx512(const float* x, const float* dy, float* dx, int64_t h, int64_t w) {
  const int64_t ho = h / 2, wo = w / 2;
  // dy of the chunk's window j, in lanes 2j and 2j + 1.
  const __m512i pairs = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  for (int64_t i = 0; i < ho; ++i) {
    const float* r0 = x + 2 * i * w;
    const float* r1 = r0 + w;
    const float* g = dy + i * wo;
    float* d0 = dx + 2 * i * w;
    float* d1 = d0 + w;
    for (int64_t c = 0; c < w; c += 16) {
      const int64_t cols = w - c < 16 ? w - c : 16;
      const Chunk k = load_chunk(r0 + c, r1 + c, cols);
      if (chunk_has_nan(k)) return false;
      const Chain ch = chain(k);
      // The winner, flagged in its window's even lane: d if it took over last, else c, else b, else a.
      const auto win_d = static_cast<__mmask16>(ch.took_d & kEven);
      const auto win_c = static_cast<__mmask16>(ch.took_c & ~ch.took_d & kEven);
      const auto win_b = static_cast<__mmask16>(ch.took_b & ~ch.took_c & ~ch.took_d & kEven);
      const auto win_a = static_cast<__mmask16>(~ch.took_b & ~ch.took_c & ~ch.took_d & kEven);
      const __m512 grad =
          _mm512_maskz_permutexvar_ps(kAll, pairs, _mm512_maskz_loadu_ps(low_lanes(cols / 2), g + c / 2));
      // b and d are the odd lanes of their rows.
      const auto top = static_cast<__mmask16>(win_a | (win_b << 1));
      const auto bottom = static_cast<__mmask16>(win_c | (win_d << 1));
      _mm512_mask_storeu_ps(d0 + c, k.load, _mm512_maskz_mov_ps(top, grad));
      _mm512_mask_storeu_ps(d1 + c, k.load, _mm512_maskz_mov_ps(bottom, grad));
    }
  }
  return true;
}
#undef TUTTI_AVX512
#endif  // TUTTI_POOL_AVX512

template <typename T>
void maxpool_forward_impl(const Tensor& x, const Tensor& y) {
  const int64_t planes = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3), ho = h / 2, wo = w / 2;
  const T* xp = x.data_as<T>();
  T* yp = y.data_as<T>();
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xs = xp + pl * h * w;
    T* ys = yp + pl * ho * wo;
    if constexpr (std::is_same_v<T, float>) {
#if TUTTI_POOL_AVX512
      if (have_avx512() && maxpool_forward_plane_avx512(xs, ys, h, w)) continue;
#endif
      if (maxpool_forward_plane_f32(xs, ys, h, w)) continue;
    }
    for (int64_t i = 0; i < ho; ++i) {
      const T* r0 = xs + (2 * i) * w;
      const T* r1 = r0 + w;
      for (int64_t j = 0; j < wo; ++j) {
        const float v[4] = {to_float(r0[2 * j]), to_float(r0[2 * j + 1]), to_float(r1[2 * j]), to_float(r1[2 * j + 1])};
        const int a = argmax4(v);
        // Copy the element itself: no rounding through fp32 and back.
        ys[i * wo + j] = a == 0 ? r0[2 * j] : a == 1 ? r0[2 * j + 1] : a == 2 ? r1[2 * j] : r1[2 * j + 1];
      }
    }
  }
}

template <typename T>
void maxpool_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t planes = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3), ho = h / 2, wo = w / 2;
  const T* xp = x.data_as<T>();
  const T* dyp = dy.data_as<T>();
  T* dxp = dx.data_as<T>();
  const T zero = from_float<T>(0.0f);
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xs = xp + pl * h * w;
    const T* dys = dyp + pl * ho * wo;
    T* dxs = dxp + pl * h * w;
    if constexpr (std::is_same_v<T, float>) {
#if TUTTI_POOL_AVX512
      if (have_avx512() && maxpool_backward_plane_avx512(xs, dys, dxs, h, w)) continue;
#endif
      if (maxpool_backward_plane_f32(xs, dys, dxs, h, w)) continue;
    }
    for (int64_t i = 0; i < ho; ++i) {
      const T* r0 = xs + (2 * i) * w;
      const T* r1 = r0 + w;
      T* d0 = dxs + (2 * i) * w;
      T* d1 = d0 + w;
      for (int64_t j = 0; j < wo; ++j) {
        const float v[4] = {to_float(r0[2 * j]), to_float(r0[2 * j + 1]), to_float(r1[2 * j]), to_float(r1[2 * j + 1])};
        const int a = argmax4(v);
        const T g = dys[i * wo + j];
        d0[2 * j] = a == 0 ? g : zero;
        d0[2 * j + 1] = a == 1 ? g : zero;
        d1[2 * j] = a == 2 ? g : zero;
        d1[2 * j + 1] = a == 3 ? g : zero;
      }
    }
  }
}

}  // namespace

void maxpool2x2_forward(const Tensor& x, const Tensor& y) {
  detail::dispatch_floating("maxpool2x2_forward", x.dtype(),
                            [&](auto tag) { maxpool_forward_impl<decltype(tag)>(x, y); });
}

void maxpool2x2_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  detail::dispatch_floating("maxpool2x2_backward", x.dtype(),
                            [&](auto tag) { maxpool_backward_impl<decltype(tag)>(x, dy, dx); });
}

}  // namespace tutti::kernels::cpu
