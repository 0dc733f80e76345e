// The tiled attention's small products, register-tiled here instead of going through OpenBLAS.
// Internal header (kernels/cpu/flash_attention.cc).
//
// Why not sgemm: the tiles are small (32-64 queries x up to 256 keys, K = the head size, often
// 32-96), and each OpenBLAS call packs both operands again and runs its micro-kernel over a K of
// 32: at gpt-tiny's tiles it ran 60-72 GFLOP/s on a core whose 1024^3 sgemm runs at ~90.
// This kernel reads A in place through strides (so a transposed A costs nothing), takes B as rows
// of contiguous columns (the caller transposes k^T and v^T once per head, not per tile), copies
// each 16-column panel of B to a contiguous buffer on every call (so B is read twice: see
// tile_gemm.cc for why), and keeps a 6 x 16 block of C in registers over the whole K: 83-88
// GFLOP/s at the same tiles, 78-92 at larger ones (AVX2, side by side:
// benchmarks/kernels/tile_gemm_bench, docs/benchmarks.md).
#pragma once

#include <cstdint>

namespace tutti::kernels::cpu {

// C[M, N] = alpha · sum_k A(i, k) · B[k, n], added to C when `accumulate`, else stored over it
// (C is then not read: nan in it does not propagate). A(i, k) = A[i · a_row + k · a_col] (any
// strides: a_row = 1, a_col = lda reads a transposed matrix); B is row-major, N contiguous columns
// a row, rows ldb apart; C row-major, rows ldc apart. K = 0 stores 0 (or leaves C). The sum over k
// runs in order, with fused multiply-adds where the CPU has them.
void tile_gemm(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A, std::int64_t a_row,
               std::int64_t a_col, const float* B, std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc);

// dst[c, r] = src[r, c] for r < rows, c < cols: src rows ld_src apart, dst rows ld_dst apart.
// Packs a head's keys (or values) as the k^T that tile_gemm takes as B.
void transpose_into(const float* src, std::int64_t rows, std::int64_t cols, std::int64_t ld_src, float* dst,
                    std::int64_t ld_dst);

}  // namespace tutti::kernels::cpu
