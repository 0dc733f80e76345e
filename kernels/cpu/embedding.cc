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

void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out,
                       const EmbeddingRows& rows) {
  const int64_t V = wte.dim(0), C = wte.dim(1), T = tokens.dim(1), N = tokens.numel();
  check_tokens("embedding_forward", tokens, rows.total);
  const auto* tok = tokens.data_as<std::int32_t>();
  const F32Buffer E(wte, true), P(wpe, true), O(out, false);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = static_cast<int64_t>(tok[n]) - rows.first;
    const float* e = row >= 0 && row < V ? E.data() + row * C : nullptr;  // null: another rank's row
    float* o = O.data() + n * C;
    const float* p = P.data() != nullptr ? P.data() + (n % T) * C : nullptr;  // Llama has none
    if (e != nullptr && p != nullptr) {
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else if (e != nullptr) {
      std::copy(e, e + C, o);
    } else if (p != nullptr) {
      std::copy(p, p + C, o);
    } else {
      std::fill(o, o + C, 0.0f);
    }
  }
  O.store();
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte, const Tensor& dwpe,
                        bool accumulate_params, const EmbeddingRows& rows) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = dout.dim(2), N = tokens.numel();
  const F32Buffer DO(dout, true);
  if (dwte.defined()) {
    check_tokens("embedding_backward", tokens, rows.total);
    const auto* tok = tokens.data_as<std::int32_t>();
    const int64_t first = rows.first, last = rows.first + dwte.dim(0);  // this table's rows
    // Each token's rows are summed in position order, then added to the old value: the
    // order the GPU's deterministic scatter-add uses too.
    const F32Buffer DW(dwte, accumulate_params);
    if (!accumulate_params) std::fill(DW.data(), DW.data() + dwte.numel(), 0.0f);
    std::vector<float> sum(static_cast<std::size_t>(C));
    std::vector<std::int64_t> order;  // the positions of this table's tokens
    order.reserve(static_cast<std::size_t>(N));
    for (int64_t n = 0; n < N; ++n)
      if (tok[n] >= first && tok[n] < last) order.push_back(n);
    std::stable_sort(order.begin(), order.end(), [tok](int64_t a, int64_t b) { return tok[a] < tok[b]; });
    const auto M = static_cast<int64_t>(order.size());
    for (int64_t s = 0; s < M;) {
      const std::int32_t t = tok[order[static_cast<std::size_t>(s)]];
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (; s < M && tok[order[static_cast<std::size_t>(s)]] == t; ++s) {
        const float* d = DO.data() + order[static_cast<std::size_t>(s)] * C;
        for (int64_t c = 0; c < C; ++c) sum[static_cast<std::size_t>(c)] += d[c];
      }
      float* w = DW.data() + (static_cast<int64_t>(t) - first) * C;
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
