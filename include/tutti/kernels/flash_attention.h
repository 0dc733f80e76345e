// Causal self-attention without the T x T matrix: forward and backward in tiles of queries and
// keys with an online softmax, the scores recomputed in backward (the FlashAttention scheme:
// Dao et al. 2022, and FlashAttention-2's loop order in backward). What is kept between forward
// and backward is the output and one f32 per query and head (the log-sum-exp of its scores), so
// attention's memory grows linearly in T. With grouped-query attention (GQA) several query heads
// share one key/value head, read in place (never copied per query head). See linear.h for the
// conventions; attention.h is the reference that keeps the probabilities.
//
// Shapes, with hs the head size, H = heads and G = kv_heads (G divides H; query head h reads
// key/value head h / (H / G)):
//   qkv [B, T, (H + 2G)·hs]: the H query heads, then the G key heads, then the G value heads,
//                            hs columns each (GPT-2's packed [q | k | v] when G = H)
//   out [B, T, H·hs]:        out[b, t, h·hs + i] = sum_{s <= t} P[b, h, t, s] · v[b, s, g·hs + i],
//                            P = softmax over s <= t of q·k / sqrt(hs) (the causal mask), g = h / (H / G)
//   lse [B, H, T] f32:       log(sum_{s <= t} exp(q·k / sqrt(hs))) of each query: all backward
//                            needs besides qkv and out
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::kernels {

struct FlashAttentionParams {
  std::int64_t heads = 1;     // H, query heads
  std::int64_t kv_heads = 0;  // G, key/value heads; 0 means H (multi-head attention)
  // Tile sizes in queries and keys; 0 lets the kernel choose (CPU: 64 queries x 256 keys, 32
  // queries up to T = 256; CUDA: 256 x 256). Only speed and scratch memory depend on them (and the rounding of
  // the sums: each tile is added in turn), so tests shrink them to cross many tiles.
  std::int64_t query_tile = 0;
  std::int64_t key_tile = 0;
};

// Writes out and lse. H >= 1, G divides H, T >= 1; qkv's width must be (H + 2G)·hs for some
// hs >= 1.
void flash_attention_forward(const Tensor& qkv, const FlashAttentionParams& params, const Tensor& out,
                             const Tensor& lse, const Stream& stream = Stream());

// Given dout [B, T, H·hs]: dqkv [B, T, (H + 2G)·hs] (written, never accumulated; the key and
// value heads' gradients summed over the query heads that share them). qkv, out and lse are the
// forward's.
void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              const FlashAttentionParams& params, const Tensor& dqkv, const Stream& stream = Stream());

// Bytes of device scratch one call on the GPU allocates for these shapes, stream-ordered and
// freed when the call returns (the memory planner's "GPU kernel scratch"): forward and backward.
// dtype is qkv's. The CPU path's scratch is host memory of a few tiles.
std::int64_t flash_attention_gpu_scratch_bytes(std::int64_t B, std::int64_t T, std::int64_t head_size,
                                               const FlashAttentionParams& params, DType dtype, bool backward);

}  // namespace tutti::kernels
