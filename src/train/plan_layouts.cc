// The layouts memory_plan reads (plan_layout.h): for each model, its parameters, the order of its
// backward's gradient placements and reports, and its layers' reusable buffers, written from the
// layers' code (src/nn/layers.cc, src/nn/transformer.cc: each Module::buffer call, its slot and its
// shape) and the model's constructor (src/models/gpt.cc, llama.cc).
#include <algorithm>

#include "train/plan_layout.h"
#include "tutti/kernels/flash_attention.h"

namespace tutti::train::detail {

std::int64_t bytes_of(DType d) { return static_cast<std::int64_t>(size_of(d)); }

using models::CausalLm;
using models::GptConfig;
using models::Llama;
using models::LlamaConfig;
using models::Recompute;

std::int64_t Body::bytes() const {
  std::int64_t n = 0;
  for (const BodyBuffer& b : buffers) n += b.bytes;
  return n;
}

std::int64_t Body::at(int position, int slot) const {
  for (const BodyBuffer& b : buffers) {
    if (b.position == position && b.slot == slot) return b.bytes;
  }
  return 0;
}

namespace {

// The sequence length a plan is for.
std::int64_t seq_len(const PlanOptions& o, std::int64_t context) { return o.seq_len == 0 ? context : o.seq_len; }

// Backward's events of a layer whose parameters are params [first, first + count): it places each
// gradient in turn (grad_of), then reports them in reverse (grad_ready), as Linear, LayerNorm and
// RMSNorm do.
void layer_events(std::vector<GradEvent>& out, std::size_t first, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) out.push_back({false, first + i});
  for (std::size_t i = count; i-- > 0;) out.push_back({true, first + i});
}

// Attention's saved tensor and the GPU scratch of its kernels.
struct AttentionCost {
  std::int64_t saved = 0;        // lse [B, H, T] f32, or the probabilities [B, H, T, T]
  std::int64_t gpu_scratch = 0;  // the largest stream-ordered scratch of forward and backward
  std::string detail;
};
AttentionCost attention_cost(nn::AttentionKernel kernel, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t G,
                             std::int64_t hs, DType compute) {
  AttentionCost a;
  const std::int64_t cd = bytes_of(compute);
  if (kernel == nn::AttentionKernel::materialized) {
    // kernels/cuda/attention.cu: backward's q, k, v, dy, dq, dk, dv head-major and dP.
    a.saved = B * H * T * T * cd;
    a.gpu_scratch = (7 * B * T * H * hs + B * H * T * T) * cd;
    a.detail = "attention backward's scratch (q, k, v, dy, dq, dk, dv and the T x T dP)";
  } else {
    const kernels::FlashAttentionParams p{H, G};
    a.saved = B * H * T * 4;
    a.gpu_scratch = std::max(kernels::flash_attention_gpu_scratch_bytes(B, T, hs, p, compute, false),
                             kernels::flash_attention_gpu_scratch_bytes(B, T, hs, p, compute, true));
    a.detail = "tiled attention's scratch (head-major q, k, v, dy, dq and one tile of scores)";
  }
  return a;
}

constexpr std::int64_t kCublasLtWorkspace = 32 << 20;  // kernels/cuda/linear.cu's, per stream

// What every decoder's head, loss and kernels add: the logits [B, T, V] (V: this rank's columns),
// the loss's gradient of them and the head's input gradient, and with the vocabulary split over
// tp ranks the loss's row statistics [3, N] f32 (parallel::VocabParallelCrossEntropy); an
// evaluation's loss between steps; the GPU scratch.
void head_and_scratch(DecoderLayout& d, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t V, std::int64_t tp,
                      DType compute, const AttentionCost& a, std::int64_t rows) {
  const std::int64_t N = B * T, cd = bytes_of(compute), stats = tp > 1 ? 3 * N * 4 : 0;
  d.logits_bytes = 2 * N * V * cd + rows * C * cd + stats;
  d.logits_detail = "[" + std::to_string(B) + ", " + std::to_string(T) + ", " + std::to_string(V) + "] " +
                    std::string(name_of(compute)) + " and the loss's gradient of them, + the head's input gradient";
  if (tp > 1) d.logits_detail += " (the vocabulary's 1/" + std::to_string(tp) + ")";
  d.eval_bytes = N * V * cd + N * 4 + 16 + stats;
  d.gpu_scratch = a.gpu_scratch + kCublasLtWorkspace;
  d.gpu_scratch_detail = a.detail + " + cuBLASLt's workspace (not in Storage's count)";
}

// The rows a rank's norms and residual stream hold: N, or N/tp with sequence parallelism where
// they divide (parallel::SequenceParallel::begin); then the two whole [N, C] buffers its split
// layers share.
std::int64_t stream_rows(DecoderLayout& d, std::int64_t N, std::int64_t C, const PlanOptions& o) {
  const std::int64_t tp = o.tensor_parallel;
  if (!o.sequence_parallel || tp == 1 || N % tp != 0) return N;
  d.sequence_bytes = 2 * N * C * bytes_of(o.compute);
  d.sequence_detail = "2 x [" + std::to_string(N) + ", " + std::to_string(C) +
                      "]: the gathered rows and the partial sums, shared by the split layers";
  return N / tp;
}

}  // namespace

DecoderLayout gpt_layout(const GptConfig& c, const PlanOptions& o) {
  const std::int64_t T = seq_len(o, c.context), B = o.micro_batch, N = B * T, C = c.width, V = c.padded_vocab;
  const std::int64_t cd = bytes_of(o.compute), tp = o.tensor_parallel;
  TUTTI_CHECK_ARG(c.heads % tp == 0, "memory_plan: ", c.heads, " heads must divide by tensor_parallel ", tp);
  DecoderLayout d;
  d.fingerprint = c.fingerprint();
  d.parameters = c.parameter_count();
  d.layers = c.layers;
  // Gpt registers (gpt.h): the embeddings, per layer the attention block (LayerNorm, Linear(C, 3C),
  // attention, Linear(C, C)) and the MLP block (LayerNorm, Linear(C, 4C), GELU, Linear(4C, C)), ln_f.
  // Split over tp ranks (Megatron's): the first Linear's rows and the second's columns are 1/tp,
  // the second's bias whole; wte's rows (the vocabulary), so the logits' columns, are 1/tp.
  TUTTI_CHECK_ARG(V % tp == 0, "memory_plan: the padded vocabulary ", V, " must divide by tensor_parallel ", tp);
  d.params.push_back({"embed.wte", {V / tp, C}});
  d.params.push_back({"embed.wpe", {c.context, C}});
  for (std::int64_t l = 0; l < c.layers; ++l) {
    for (const std::int64_t wide : {3 * C, 4 * C}) {
      const std::string block = "blocks." + std::to_string(2 * l + (wide == 4 * C ? 1 : 0)) + ".body.";
      d.params.push_back({block + "0.gamma", {C}});
      d.params.push_back({block + "0.beta", {C}});
      d.params.push_back({block + "1.weight", {wide / tp, C}});
      d.params.push_back({block + "1.bias", {wide / tp}});
      d.params.push_back({block + "3.weight", {C, (wide == 4 * C ? 4 * C : C) / tp}});
      d.params.push_back({block + "3.bias", {C}});
    }
  }
  d.params.push_back({"ln_f.gamma", {C}});
  d.params.push_back({"ln_f.beta", {C}});
  // Split over the group: wte and each block's first Linear (weight and bias) and second weight.
  for (const nn::PlanParam& p : d.params) {
    const bool first = p.name.ends_with(".1.weight") || p.name.ends_with(".1.bias");
    d.split.push_back(tp > 1 && (p.name == "embed.wte" || first || p.name.ends_with(".3.weight")));
  }
  d.gather_group = CausalLm::gather_group;
  d.resident = "embeddings, ln_f";
  // Backward: the tied head adds its share of wte first; ln_f; the layers from the last, each
  // MLP then attention, each block's output projection, first Linear, LayerNorm; the embeddings.
  const std::size_t n = d.params.size();
  d.backward_order.push_back({false, 0});
  layer_events(d.backward_order, n - 2, 2);
  for (std::int64_t l = c.layers; l-- > 0;) {
    const std::size_t first = 2 + static_cast<std::size_t>(l) * 12;
    for (const std::size_t block : {first + 6, first}) {
      layer_events(d.backward_order, block + 4, 2);
      layer_events(d.backward_order, block + 2, 2);
      layer_events(d.backward_order, block, 2);
    }
  }
  layer_events(d.backward_order, 0, 2);
  // The bodies. LayerNorm: y, mean, rstd (forward), dx; Linear: y, then dx; attention: y, its saved
  // tensor, then dqkv; GELU: y, then dx. Held: each layer's input (the previous one's y) and saved
  // statistics.
  // A rank's slices: Ct = C/tp of the heads' width, 4Ct of the MLP's; the inputs and outputs of the
  // blocks (and the dx of the column-parallel Linear) stay whole.
  // With sequence parallelism the LayerNorms, the column-parallel Linear's dx, the row-parallel
  // one's y and the residual stream hold R = N/tp rows; each LayerNorm's partial parameter
  // gradients take a [2, C] scratch.
  const std::int64_t Ct = C / tp, H = c.heads / tp, R = stream_rows(d, N, C, o);
  const std::int64_t partial = R < N ? 2 * C * bytes_of(o.grad) : 0;
  const AttentionCost a = attention_cost(c.attention, B, T, H, H, C / c.heads, o.compute);
  const auto layernorm = [&](Body& body) {
    body.buffers.push_back({0, 0, R * C * cd, true, true});
    body.buffers.push_back({0, 1, R * 4, true, true});
    body.buffers.push_back({0, 2, R * 4, true, true});
    body.buffers.push_back({0, 3, R * C * cd, false, false});
    if (partial) body.buffers.push_back({0, 6, partial, false, false});
  };
  layernorm(d.attention);
  d.attention.buffers.push_back({1, 0, 3 * N * Ct * cd, true, true});
  d.attention.buffers.push_back({1, 1, R * C * cd, false, false});
  d.attention.buffers.push_back({2, 0, N * Ct * cd, true, true});
  d.attention.buffers.push_back({2, 1, a.saved, true, true});
  d.attention.buffers.push_back({2, 2, 3 * N * Ct * cd, false, false});
  d.attention.buffers.push_back({3, 0, R * C * cd, true, false});
  d.attention.buffers.push_back({3, 1, N * Ct * cd, false, false});
  layernorm(d.mlp);
  d.mlp.buffers.push_back({1, 0, 4 * N * Ct * cd, true, true});
  d.mlp.buffers.push_back({1, 1, R * C * cd, false, false});
  d.mlp.buffers.push_back({2, 0, 4 * N * Ct * cd, true, true});
  d.mlp.buffers.push_back({2, 1, 4 * N * Ct * cd, false, false});
  d.mlp.buffers.push_back({3, 0, R * C * cd, true, false});
  d.mlp.buffers.push_back({3, 1, 4 * N * Ct * cd, false, false});
  d.residual_bytes = 2 * R * C * cd;
  d.outside_bytes = R * C * cd + 2 * R * C * cd + 2 * R * 4 + partial;
  d.outside_detail = "the embedding's output and ln_f";
  head_and_scratch(d, B, T, C, V / tp, tp, o.compute, a, R);
  return d;
}

DecoderLayout llama_layout(const LlamaConfig& c, const PlanOptions& o) {
  c.validate();
  const std::int64_t T = seq_len(o, c.context), B = o.micro_batch, N = B * T, C = c.width, V = c.vocab;
  // A rank's slices over tp ranks (Megatron's split, as Llama(config, group)): H/tp query heads,
  // G/tp key/value heads, F/tp of the MLP's features, V/tp of the vocabulary (the embedding's and
  // the head's rows, the logits' columns); the blocks' inputs and outputs stay whole.
  const std::int64_t tp = o.tensor_parallel;
  TUTTI_CHECK_ARG(c.heads % tp == 0 && c.kv_heads % tp == 0 && c.ffn % tp == 0 && V % tp == 0, "memory_plan: ", c.heads,
                  " heads, ", c.kv_heads, " key/value heads, ffn ", c.ffn, " and the vocabulary ", V,
                  " must divide by tensor_parallel ", tp);
  const std::int64_t H = c.heads / tp, G = c.kv_heads / tp, hs = c.head_dim(), F = c.ffn / tp;
  const std::int64_t Wq = (H + 2 * G) * hs, Hc = H * hs;
  const std::int64_t cd = bytes_of(o.compute);
  DecoderLayout d;
  d.fingerprint = c.fingerprint();
  d.parameters = c.parameter_count();
  d.layers = c.layers;
  // Llama registers (llama.h): the embedding, per layer the attention block (RMSNorm, the q/k/v
  // projection, the rotary embedding, attention, the output projection) and the MLP block (RMSNorm,
  // the gate/up projection, SwiGLU, the down projection), the final norm, an untied head.
  d.params.push_back({"embed.weight", {V / tp, C}});
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string attn = "blocks." + std::to_string(2 * l) + ".body.";
    const std::string mlp = "blocks." + std::to_string(2 * l + 1) + ".body.";
    d.params.push_back({attn + "0.weight", {C}});
    d.params.push_back({attn + "1.weight", {Wq, C}});
    d.params.push_back({attn + "4.weight", {C, Hc}});
    d.params.push_back({mlp + "0.weight", {C}});
    d.params.push_back({mlp + "1.weight", {2 * F, C}});
    d.params.push_back({mlp + "3.weight", {C, F}});
  }
  d.params.push_back({"norm.weight", {C}});
  if (!c.tied_head) d.params.push_back({"head.weight", {V / tp, C}});
  // Split over the group: the embedding, the head and every projection (the norms are whole).
  for (const nn::PlanParam& p : d.params)
    d.split.push_back(tp > 1 && p.name.find("norm") == std::string::npos && !p.name.ends_with(".0.weight"));
  d.gather_group = Llama::gather_groups(c);
  d.resident = c.tied_head ? "the embedding (the tied head's weight), the final norm" : "the final norm";
  // Backward: the head (untied: its weight; tied: its share of the embedding's), the final norm,
  // the layers from the last, each MLP then attention, each block's projections and norm from the
  // last; the embedding.
  const std::size_t n = d.params.size(), norm = c.tied_head ? n - 1 : n - 2;
  if (c.tied_head)
    d.backward_order.push_back({false, 0});
  else
    layer_events(d.backward_order, n - 1, 1);
  layer_events(d.backward_order, norm, 1);
  for (std::int64_t l = c.layers; l-- > 0;) {
    const std::size_t first = 1 + static_cast<std::size_t>(l) * 6;
    for (std::size_t i = 6; i-- > 0;) layer_events(d.backward_order, first + i, 1);
  }
  layer_events(d.backward_order, 0, 1);
  // The bodies. RMSNorm: y, rstd (forward), dx; Linear: y, then dx; the rotary embedding rotates
  // in place (no buffer); attention: y, its saved tensor, then dqkv; SwiGLU: y, then dx.
  // With sequence parallelism (as Gpt's) R = N/tp rows, and a [C] scratch per RMSNorm.
  const std::int64_t R = stream_rows(d, N, C, o), partial = R < N ? C * bytes_of(o.grad) : 0;
  const AttentionCost a = attention_cost(c.attention, B, T, H, G, hs, o.compute);
  const auto rmsnorm = [&](Body& body) {
    body.buffers.push_back({0, 0, R * C * cd, true, true});
    body.buffers.push_back({0, 1, R * 4, true, true});
    body.buffers.push_back({0, 2, R * C * cd, false, false});
    if (partial) body.buffers.push_back({0, 3, partial, false, false});
  };
  rmsnorm(d.attention);
  d.attention.buffers.push_back({1, 0, N * Wq * cd, true, true});
  d.attention.buffers.push_back({1, 1, R * C * cd, false, false});
  d.attention.buffers.push_back({3, 0, N * Hc * cd, true, true});
  d.attention.buffers.push_back({3, 1, a.saved, true, true});
  d.attention.buffers.push_back({3, 2, N * Wq * cd, false, false});
  d.attention.buffers.push_back({4, 0, R * C * cd, true, false});
  d.attention.buffers.push_back({4, 1, N * Hc * cd, false, false});
  rmsnorm(d.mlp);
  d.mlp.buffers.push_back({1, 0, N * 2 * F * cd, true, true});
  d.mlp.buffers.push_back({1, 1, R * C * cd, false, false});
  d.mlp.buffers.push_back({2, 0, N * F * cd, true, true});
  d.mlp.buffers.push_back({2, 1, N * 2 * F * cd, false, false});
  d.mlp.buffers.push_back({3, 0, R * C * cd, true, false});
  d.mlp.buffers.push_back({3, 1, N * F * cd, false, false});
  d.residual_bytes = 2 * R * C * cd;
  // The embedding's output, the final norm's buffers and the rotary table the layers share.
  d.outside_bytes = R * C * cd + 2 * R * C * cd + R * 4 + partial + T * hs * 4;
  d.outside_detail = "the embedding's output, the final norm and the rotary table";
  head_and_scratch(d, B, T, C, V / tp, tp, o.compute, a, R);
  return d;
}

}  // namespace tutti::train::detail
