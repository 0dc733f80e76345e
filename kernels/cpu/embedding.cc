#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/common.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// Every token in [0, V), checked before anything is written.
void check_tokens(const char* op, const Tensor& tokens, int64_t V) {
  const auto* tok = tokens.data_as<std::int32_t>();
  for (int64_t n = 0; n < tokens.numel(); ++n) {
    TUTTI_CHECK_ARG(tok[n] >= 0 && tok[n] < V, op, ": token ", tok[n], " at position ", n, " of ", tokens.str(),
                    " is not in the vocabulary [0, ", V, ")");
  }
}

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out) {
  const int64_t V = wte.dim(0), C = wte.dim(1), T = tokens.dim(1), N = tokens.numel();
  check_tokens("embedding_forward", tokens, V);
  const auto* tok = tokens.data_as<std::int32_t>();
  const F32Buffer E(wte, true), P(wpe, true), O(out, false);
  for (int64_t n = 0; n < N; ++n) {
    const float* e = E.data() + static_cast<int64_t>(tok[n]) * C;
    float* o = O.data() + n * C;
    if (P.data() == nullptr) {  // no position table (Llama: positions are rotations in attention)
      for (int64_t c = 0; c < C; ++c) o[c] = e[c];
      continue;
    }
    const float* p = P.data() + (n % T) * C;
    for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
  O.store();
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte, const Tensor& dwpe,
                        bool accumulate_params) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = dout.dim(2), N = tokens.numel();
  const F32Buffer DO(dout, true);
  if (dwte.defined()) {
    check_tokens("embedding_backward", tokens, dwte.dim(0));
    const auto* tok = tokens.data_as<std::int32_t>();
    // Each token's rows are summed in position order, then added to the old value: the
    // order the GPU's deterministic scatter-add uses too.
    const F32Buffer DW(dwte, accumulate_params);
    if (!accumulate_params) std::fill(DW.data(), DW.data() + dwte.numel(), 0.0f);
    std::vector<float> sum(static_cast<std::size_t>(C));
    std::vector<std::int64_t> order(static_cast<std::size_t>(N));
    for (int64_t n = 0; n < N; ++n) order[static_cast<std::size_t>(n)] = n;
    std::stable_sort(order.begin(), order.end(), [tok](int64_t a, int64_t b) { return tok[a] < tok[b]; });
    for (int64_t s = 0; s < N;) {
      const std::int32_t t = tok[order[static_cast<std::size_t>(s)]];
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (; s < N && tok[order[static_cast<std::size_t>(s)]] == t; ++s) {
        const float* d = DO.data() + order[static_cast<std::size_t>(s)] * C;
        for (int64_t c = 0; c < C; ++c) sum[static_cast<std::size_t>(c)] += d[c];
      }
      float* w = DW.data() + static_cast<int64_t>(t) * C;
      for (int64_t c = 0; c < C; ++c) w[c] += sum[static_cast<std::size_t>(c)];
    }
    DW.store();
  }
  if (dwpe.defined()) {
    const F32Buffer DP(dwpe, accumulate_params);
    if (!accumulate_params) std::fill(DP.data(), DP.data() + dwpe.numel(), 0.0f);
    std::vector<float> sum(static_cast<std::size_t>(C));
    for (int64_t t = 0; t < T; ++t) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t b = 0; b < B; ++b) {
        const float* d = DO.data() + (b * T + t) * C;
        for (int64_t c = 0; c < C; ++c) sum[static_cast<std::size_t>(c)] += d[c];
      }
      float* w = DP.data() + t * C;
      for (int64_t c = 0; c < C; ++c) w[c] += sum[static_cast<std::size_t>(c)];
    }
    DP.store();
  }
}

}  // namespace tutti::kernels::cpu
