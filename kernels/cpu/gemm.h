// The one OpenBLAS call every CPU kernel multiplies through (linear, attention, the tiled
// attention, convolutions). Internal header.
#pragma once

#include <cstdint>

namespace tutti::kernels::cpu {

// Row-major C[M, N] = alpha · op(A) · op(B) + beta · C on fp32 memory with leading dimensions
// (lda, ldb, ldc: the elements between rows as stored, so that the heads of a packed qkv are read
// in place). op(A) is [M, K]: A is stored [M, K], or [K, M] when transposed; likewise B is [K, N]
// or [N, K]. With beta = 0, C is not read (nan in it does not propagate): its rows are zeroed here
// and OpenBLAS accumulates into them, which skips OpenBLAS's own pass that scales C by beta (one
// pass over C fewer: 3.5% of gpt-tiny's Linear time). K = 0 gives beta · C.
void sgemm(bool transpose_a, bool transpose_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
           const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

}  // namespace tutti::kernels::cpu
