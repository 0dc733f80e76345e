// Public embedding ops: validate, then run on the tensors' device.
#include "tutti/kernels/embedding.h"

#include "kernels/cpu/embedding.h"
#include "kernels/cuda/embedding.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

void require_tokens(const char* op, const Tensor& tokens) {
  detail::require_defined(op, "tokens", tokens);
  TUTTI_CHECK_ARG(tokens.dtype() == DType::i32 && tokens.ndim() == 2, op, ": tokens must be [B, T] i32, got ",
                  tokens.str());
}

// rows with total filled in (wte's own rows by default); InvalidArgument unless wte's rows lie in
// the whole table.
EmbeddingRows whole_rows(const char* op, const EmbeddingRows& rows, std::int64_t table_rows) {
  if (rows.total == 0) {
    TUTTI_CHECK_ARG(rows.first == 0, op, ": rows.first ", rows.first, " needs rows.total (the whole table's rows)");
    return {0, table_rows};
  }
  TUTTI_CHECK_ARG(rows.first >= 0 && rows.first + table_rows <= rows.total, op, ": the table's ", table_rows,
                  " rows from row ", rows.first, " are not within the whole table's ", rows.total);
  return rows;
}

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out,
                       const EmbeddingRows& rows, const Stream& stream) {
  constexpr const char* op = "embedding_forward";
  require_tokens(op, tokens);
  detail::require_floating(op, "wte", wte);
  TUTTI_CHECK_ARG(wte.ndim() == 2, op, ": wte must be [V, C], got ", wte.str());
  const std::int64_t C = wte.dim(1), T = tokens.dim(1);
  if (wpe.defined()) {
    detail::require_dtype(op, "wpe", wpe, wte.dtype());
    TUTTI_CHECK_ARG(wpe.ndim() == 2 && wpe.dim(1) == C && wpe.dim(0) >= T, op, ": wpe must be [T_max >= ", T, ", ", C,
                    "] for tokens ", tokens.str(), " and wte ", wte.str(), ", got ", wpe.str());
  }
  detail::require_dtype(op, "out", out, wte.dtype());
  detail::require_shape(op, "out", out, {tokens.dim(0), T, C});
  const EmbeddingRows whole = whole_rows(op, rows, wte.dim(0));
  const Device device = detail::require_same_device(op, {&tokens, &wte, &wpe, &out}, stream);
  if (device.is_cuda())
    cuda::embedding_forward(tokens, wte, wpe, out, whole, stream);
  else
    cpu::embedding_forward(tokens, wte, wpe, out, whole);
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte, const Tensor& dwpe,
                        bool accumulate_params, const EmbeddingRows& rows, const Stream& stream) {
  constexpr const char* op = "embedding_backward";
  require_tokens(op, tokens);
  detail::require_floating(op, "dout", dout);
  TUTTI_CHECK_ARG(dout.ndim() == 3 && dout.dim(0) == tokens.dim(0) && dout.dim(1) == tokens.dim(1), op,
                  ": dout must be [B, T, C] for tokens ", tokens.str(), ", got ", dout.str());
  const std::int64_t C = dout.dim(2);
  if (dwte.defined()) {
    detail::require_dtype_or_f32(op, "dwte", dwte, dout.dtype());
    TUTTI_CHECK_ARG(dwte.ndim() == 2 && dwte.dim(1) == C, op, ": dwte must be [V, ", C, "], got ", dwte.str());
  }
  if (dwpe.defined()) {
    detail::require_dtype_or_f32(op, "dwpe", dwpe, dout.dtype());
    TUTTI_CHECK_ARG(dwpe.ndim() == 2 && dwpe.dim(1) == C && dwpe.dim(0) >= tokens.dim(1), op,
                    ": dwpe must be [T_max >= ", tokens.dim(1), ", ", C, "], got ", dwpe.str());
  }
  const EmbeddingRows whole = dwte.defined() ? whole_rows(op, rows, dwte.dim(0)) : EmbeddingRows{};
  const Device device = detail::require_same_device(op, {&tokens, &dout, &dwte, &dwpe}, stream);
  if (device.is_cuda())
    cuda::embedding_backward(tokens, dout, dwte, dwpe, accumulate_params, whole, stream);
  else
    cpu::embedding_backward(tokens, dout, dwte, dwpe, accumulate_params, whole);
}

}  // namespace tutti::kernels
