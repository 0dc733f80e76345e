// The shape of one tiled-attention call (kernels/flash_attention.cc has validated it) and the
// tile sizes each device uses, shared by the CPU and CUDA paths and by the memory planner's
// figure of the GPU path's scratch. Internal header; plain C++.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace tutti::kernels {

struct FlashShape {
  std::int64_t B, T, H, G, hs;                // batch, sequence, query heads, key/value heads, head size
  std::int64_t query_tile = 0, key_tile = 0;  // as asked (0: the device's default)

  std::int64_t group() const { return H / G; }  // query heads per key/value head
  std::int64_t width() const { return (H + 2 * G) * hs; }
};

// CPU: 64 queries x 256 keys (32 queries up to T = 256, where the GEMMs are small and the diagonal
// tile's waste counts), a 64 KiB tile of f32 scores beside the q, k and v rows it is made of.
// Measured with one thread, 12 heads of 64, forward + backward against the materialized kernel
// (kernel_bench --flash-tiles, docs/bring-your-own-model.md): at T 1024 to 4096 tiles of 64-128
// queries x 128-256 keys are within a few % of each other; 32 queries were slower there, and
// faster at T 128.
inline std::int64_t cpu_query_tile(const FlashShape& s) {
  return std::min(s.T, s.query_tile > 0 ? s.query_tile : (s.T <= 256 ? 32 : 64));
}
inline std::int64_t cpu_key_tile(const FlashShape& s) { return std::min(s.T, s.key_tile > 0 ? s.key_tile : 256); }

// CUDA: the tiles are cuBLAS GEMMs batched over the B·G key/value heads (kernels/cuda/flash_attention.cu), so
// they are large; not yet tuned on a GPU.
inline std::int64_t gpu_query_tile(const FlashShape& s) { return std::min(s.T, s.query_tile > 0 ? s.query_tile : 256); }
inline std::int64_t gpu_key_tile(const FlashShape& s) { return std::min(s.T, s.key_tile > 0 ? s.key_tile : 256); }

// The bytes the CUDA path allocates per call (one stream-ordered scratch block), as
// kernels/cuda/flash_attention.cu lays it out: the head-major copies of q, k, v (and dout), the
// per-row statistics, one tile of scores and probabilities (and their gradients), and the f32
// accumulators (the output tile; in backward every query's dq, one key tile's dk and dv).
inline std::int64_t flash_gpu_scratch_bytes(const FlashShape& s, std::size_t dtype_bytes, bool backward) {
  const std::int64_t d = static_cast<std::int64_t>(dtype_bytes), f = 4;
  const std::int64_t bq = gpu_query_tile(s), bk = gpu_key_tile(s);
  const std::int64_t q = s.B * s.T * s.H * s.hs, kv = s.B * s.T * s.G * s.hs;  // elements
  const std::int64_t tile = s.B * s.H * bq * bk;                               // scores of one tile pair
  if (!backward) {
    // q, k, v; scores (f32) and probabilities; the output tile (f32); m and l per row.
    return (q + 2 * kv) * d + tile * (f + d) + s.B * s.H * bq * s.hs * f + 2 * s.B * s.H * bq * f;
  }
  // q, k, v, dout; D per query; scores/dP (f32), P and dS; dq (f32, all queries); dk and dv (f32, one key tile).
  return (2 * q + 2 * kv) * d + s.B * s.H * s.T * f + tile * (f + 2 * d) + q * f + 2 * s.B * s.G * bk * s.hs * f;
}

}  // namespace tutti::kernels
