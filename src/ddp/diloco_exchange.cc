// DiLoCo (tutti/ddp/diloco.h): the exchange of the pseudo-gradients across the nodes, per outer
// dtype, in two halves (launch: what travels without the host; finish: the rest).
#include <algorithm>

#include "tutti/core/error.h"
#include "tutti/ddp/diloco.h"
#include "tutti/kernels/cast.h"
#include "tutti/kernels/compress.h"
#include "tutti/kernels/elementwise.h"

namespace tutti::ddp {

OuterExchange parse_outer_exchange(std::string_view text) {
  if (text == "auto") return OuterExchange::automatic;
  if (text == "allgather") return OuterExchange::allgather;
  if (text == "reduce_scatter") return OuterExchange::reduce_scatter;
  TUTTI_THROW(InvalidArgument, "--outer-exchange: '", text, "' is not one of auto, allgather, reduce_scatter");
}

const char* outer_exchange_name(OuterExchange exchange) {
  switch (exchange) {
    case OuterExchange::automatic: return "auto";
    case OuterExchange::allgather: return "allgather";
    case OuterExchange::reduce_scatter: return "reduce_scatter";
  }
  return "?";
}

namespace {

// reduce_scatter: this rank's slice of n values cut into N chunks of whole blocks, chunk c
// [c · elems, min(n, (c + 1) · elems)), quantized into regions of `words` and `blocks` each.
struct Chunks {
  std::int64_t n, elems, words, blocks;
  Chunks(std::int64_t n, int nodes, int bits, std::int64_t block) : n(n) {
    blocks = (kernels::quantized_blocks(n, block) + nodes - 1) / nodes;
    elems = blocks * block;
    words = kernels::quantized_words(elems, bits);
  }
  std::int64_t begin(int c) const { return std::min(n, c * elems); }
  std::int64_t size(int c) const { return std::min(n, (c + 1) * elems) - begin(c); }
};

}  // namespace

bool DiLoCo::reduce_scatter_exchange() const {
  if (options_.outer_dtype != OuterDType::int8 && options_.outer_dtype != OuterDType::int4) return false;
  if (options_.exchange == OuterExchange::automatic) return groups_.inter->size() >= 3;
  return options_.exchange == OuterExchange::reduce_scatter;
}

void DiLoCo::launch_exchange(const Tensor& delta, const Tensor& residual) {
  const Stream& stream = inner_.module().stream();
  const Device device = delta.device();
  const std::int64_t n = delta.numel();
  const int nodes = groups_.inter->size(), me = groups_.inter->rank();
  CallOptions call{"diloco outer sync", stream};
  Communicator& inter = *groups_.inter;
  switch (options_.outer_dtype) {
    case OuterDType::f32:
      works_.push_back(inter.allreduce(delta, ReduceOp::sum, call));
      last_bytes_ = n * 4;
      return;
    case OuterDType::bf16: {
      // v = Δ + residual; sent: bf16(v); residual = v − bf16(v).
      if (residual.defined()) kernels::add_scaled(residual, 1.0f, delta, stream);
      const Tensor half = buffer(0, {n}, DType::bf16, device);
      kernels::cast(delta, half, stream);
      if (residual.defined()) {
        Tensor(residual).copy_from(delta, stream);
        const Tensor sent = buffer(1, {n}, DType::f32, device);
        kernels::cast(half, sent, stream);
        kernels::add_scaled(sent, -1.0f, residual, stream);
      }
      works_.push_back(inter.allreduce(half, ReduceOp::sum, call));
      last_bytes_ = n * 2;
      return;
    }
    case OuterDType::int8:
    case OuterDType::int4: break;
  }
  const int bits = options_.outer_dtype == OuterDType::int8 ? 8 : 4;
  const std::int64_t block = options_.block;
  if (!reduce_scatter_exchange()) {
    // Quantized values cannot be summed on the wire: every rank gets every node's bytes.
    const std::int64_t words = kernels::quantized_words(n, bits), blocks = kernels::quantized_blocks(n, block);
    const Tensor q = buffer(0, {words}, DType::i32, device);
    const Tensor scales = buffer(1, {blocks}, DType::f32, device);
    kernels::quantize_blocks(delta, bits, block, q, scales, residual, stream);
    works_.push_back(inter.allgather(q, buffer(2, {nodes * words}, DType::i32, device), call));
    works_.push_back(inter.allgather(scales, buffer(3, {nodes * blocks}, DType::f32, device), call));
    last_bytes_ = (words + blocks) * 4;
    return;
  }
  // reduce_scatter: each chunk quantized on its own (error feedback on its own range), chunk k
  // sent to node k in N − 1 rounds of a ring rotation by k.
  const Chunks c(n, nodes, bits, block);
  const Tensor q = buffer(0, {nodes * c.words}, DType::i32, device);
  const Tensor scales = buffer(1, {nodes * c.blocks}, DType::f32, device);
  const Tensor got_q = buffer(2, {nodes * c.words}, DType::i32, device);
  const Tensor got_scales = buffer(3, {nodes * c.blocks}, DType::f32, device);
  for (int k = 0; k < nodes; ++k) {
    const std::int64_t len = c.size(k);
    if (len == 0) continue;
    kernels::quantize_blocks(delta.view(c.begin(k), {len}), bits, block,
                             q.view(k * c.words, {kernels::quantized_words(len, bits)}),
                             scales.view(k * c.blocks, {kernels::quantized_blocks(len, block)}),
                             residual.defined() ? residual.view(c.begin(k), {len}) : Tensor(), stream);
  }
  CallOptions rs{"diloco outer sync (chunks to their owners)", stream};
  for (int k = 1; k < nodes; ++k) {
    const int to = (me + k) % nodes, from = (me - k + nodes) % nodes;
    works_.push_back(
        inter.sendrecv(q.view(to * c.words, {c.words}), got_q.view(from * c.words, {c.words}), to, from, rs));
    works_.push_back(inter.sendrecv(scales.view(to * c.blocks, {c.blocks}),
                                    got_scales.view(from * c.blocks, {c.blocks}), to, from, rs));
  }
  last_bytes_ = 2 * (nodes - 1) * (c.words + c.blocks) * 4;
}

void DiLoCo::finish_exchange(const Tensor& delta, const Tensor& owner_residual) {
  const Stream& stream = inner_.module().stream();
  for (const Work& w : works_) w.wait(stream);
  works_.clear();
  const Device device = delta.device();
  const std::int64_t n = delta.numel();
  const int nodes = groups_.inter->size(), me = groups_.inter->rank();
  const float inv = 1.0f / static_cast<float>(nodes);
  switch (options_.outer_dtype) {
    case OuterDType::f32: kernels::scale(delta, inv, delta, stream); return;
    case OuterDType::bf16:
      kernels::cast(buffers_[0], delta, stream);
      kernels::scale(delta, inv, delta, stream);
      return;
    case OuterDType::int8:
    case OuterDType::int4: break;
  }
  const int bits = options_.outer_dtype == OuterDType::int8 ? 8 : 4;
  const std::int64_t block = options_.block;
  if (!reduce_scatter_exchange()) {
    // Every rank adds up every node's bytes itself, in node order (the same bits everywhere).
    const std::int64_t words = kernels::quantized_words(n, bits), blocks = kernels::quantized_blocks(n, block);
    const Tensor &all_q = buffers_[2], &all_scales = buffers_[3];
    for (int k = 0; k < nodes; ++k) {
      kernels::dequantize_blocks(all_q.view(k * words, {words}), all_scales.view(k * blocks, {blocks}), bits, block,
                                 delta, /*accumulate=*/k > 0, stream);
    }
    kernels::scale(delta, inv, delta, stream);
    return;
  }
  // The owner (this node, of chunk `me`) sums the N nodes' chunks in node order, divides by N
  // and requantizes the average (its error fed back at the owner); the averages are
  // all-gathered and everyone dequantizes the same bytes.
  const Chunks c(n, nodes, bits, block);
  const Tensor &q = buffers_[0], &scales = buffers_[1], &got_q = buffers_[2], &got_scales = buffers_[3];
  const Tensor avg_q = buffer(5, {nodes * c.words}, DType::i32, device);
  const Tensor avg_scales = buffer(6, {nodes * c.blocks}, DType::f32, device);
  const std::int64_t len = c.size(me);
  if (len > 0) {
    const std::int64_t w = kernels::quantized_words(len, bits), b = kernels::quantized_blocks(len, block);
    const Tensor sum = buffer(4, {c.elems}, DType::f32, device).view(0, {len});
    for (int k = 0; k < nodes; ++k) {
      const Tensor& from_q = k == me ? q : got_q;
      const Tensor& from_scales = k == me ? scales : got_scales;
      kernels::dequantize_blocks(from_q.view(k * c.words, {w}), from_scales.view(k * c.blocks, {b}), bits, block, sum,
                                 /*accumulate=*/k > 0, stream);
    }
    kernels::scale(sum, inv, sum, stream);
    kernels::quantize_blocks(sum, bits, block, avg_q.view(me * c.words, {w}), avg_scales.view(me * c.blocks, {b}),
                             owner_residual.defined() ? owner_residual.view(c.begin(me), {len}) : Tensor(), stream);
  }
  CallOptions call{"diloco outer sync (averaged chunks)", stream};
  const Work wq = groups_.inter->allgather(avg_q.view(me * c.words, {c.words}), avg_q, call);
  const Work ws = groups_.inter->allgather(avg_scales.view(me * c.blocks, {c.blocks}), avg_scales, call);
  wq.wait(stream);
  ws.wait(stream);
  for (int k = 0; k < nodes; ++k) {
    const std::int64_t l = c.size(k);
    if (l == 0) continue;
    kernels::dequantize_blocks(avg_q.view(k * c.words, {kernels::quantized_words(l, bits)}),
                               avg_scales.view(k * c.blocks, {kernels::quantized_blocks(l, block)}), bits, block,
                               delta.view(c.begin(k), {l}), /*accumulate=*/false, stream);
  }
}

const Tensor& DiLoCo::buffer(int i, Shape shape, DType dtype, Device device) {
  // Kept from sync to sync: a buffer freed while the stream still uses it would be a race
  // wherever freeing does not wait for the device. Zeros: the reduce_scatter chunks' padding
  // travels too.
  Tensor& b = buffers_[static_cast<std::size_t>(i)];
  if (!b.defined() || b.shape() != shape || b.dtype() != dtype) b = Tensor::zeros(std::move(shape), dtype, device);
  return b;
}

}  // namespace tutti::ddp
