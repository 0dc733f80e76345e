// Rotary position embeddings (RoPE, Su et al. 2021) as Hugging Face's Llama applies them ("rotate
// half"): in every query and key head, column i < hs/2 pairs with column i + hs/2, and the pair
// (a, b) of the token at position t turns by the angle θ = t · inv_freq[i]:
//   a' = a cos θ - b sin θ,   b' = b cos θ + a sin θ.
// The rotation is applied in place to the packed qkv of flash_attention.h (H query heads, then G
// key heads, then G value heads of hs columns each), between the projection and attention. See
// linear.h for the conventions.
#pragma once

#include <cstdint>
#include <vector>

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// The (cos θ, sin θ) of positions [0, T) for the frequencies inv_freq [hs/2]: a CPU tensor
// [T, hs/2, 2] f32. θ is computed as Hugging Face computes it, in f32 (the position times the
// frequency, rounded to f32), so that long positions turn by the same angles as there.
Tensor rope_table(const std::vector<float>& inv_freq, std::int64_t T);

// Rotates the query and key heads of qkv [B, T, (heads + 2 kv_heads)·hs] in place by the angles of
// positions 0..T-1 (table [T_max >= T, hs/2, 2] f32 from rope_table, on qkv's device; hs even).
// The value heads are left alone. Computed in fp32, rounded once.
void rope_forward(const Tensor& qkv, std::int64_t heads, std::int64_t kv_heads, const Tensor& table,
                  const Stream& stream = Stream());

// The backward of rope_forward, in place on dqkv of the same layout: a rotation's transpose is the
// rotation back, so the query and key heads turn by -θ and become the gradient with respect to
// the unrotated q and k; the value heads' gradient is left alone.
void rope_backward(const Tensor& dqkv, std::int64_t heads, std::int64_t kv_heads, const Tensor& table,
                   const Stream& stream = Stream());

}  // namespace tutti::kernels
