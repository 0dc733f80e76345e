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

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out,
                       const Stream& stream) {
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
  const Device device = detail::require_same_device(op, {&tokens, &wte, &wpe, &out}, stream);
  if (device.is_cuda())
    cuda::embedding_forward(tokens, wte, wpe, out, stream);
  else
    cpu::embedding_forward(tokens, wte, wpe, out);
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte, const Tensor& dwpe,
                        bool accumulate_params, const Stream& stream) {
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
  const Device device = detail::require_same_device(op, {&tokens, &dout, &dwte, &dwpe}, stream);
  if (device.is_cuda())
    cuda::embedding_backward(tokens, dout, dwte, dwpe, accumulate_params, stream);
  else
    cpu::embedding_backward(tokens, dout, dwte, dwpe, accumulate_params);
}

}  // namespace tutti::kernels
