// CUDA softmax cross-entropy and accuracy count.
//
// softmax_cross_entropy runs three kernels on the stream, none of which syncs the host:
//   1. count_rows: one block counts the rows that are not ignore_index (the mean's divisor,
//      which every row's gradient needs);
//   2. row kernel: one block per row: max, sum of exp (fp32, max subtracted), the row's loss
//      into a scratch array, and dlogits = grad_scale · (softmax - onehot) / count;
//   3. finish: one block sums the row losses in a fixed order (deterministic) and divides.
// A label outside [0, C) that is not ignore_index makes its row's loss (so the mean) nan,
// and its dlogits row nan: the host cannot check device labels without a sync.
// The classes split across ranks (cross_entropy_local_max, _local_sums, _from_sums): one block
// per row in each, as the row kernel above; from_sums counts the rows and finishes the loss as
// softmax_cross_entropy does.
// count_correct: one warp per row finds the argmax (first maximum on ties) and integer
// atomics add the hits (exact, so the order does not matter).
#include "kernels/cuda/cross_entropy.h"

#include "kernels/cuda/common.cuh"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

template <typename L>
__global__ void count_rows_kernel(const L* labels, int64_t n, int64_t ignore_index, int* count) {
  int local = 0;
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) local += static_cast<int64_t>(labels[r]) != ignore_index;
  local = block_allreduce_sum(local);
  if (threadIdx.x == 0) *count = local;
}

// One block per row (grid-stride over rows).
template <typename T, typename L>
__global__ void softmax_xent_row_kernel(const T* logits, const L* labels, int64_t rows, int64_t C, int64_t ignore_index,
                                        float grad_scale, const int* count, float* row_loss, T* dlogits) {
  const int counted = *count;
  // The same rounding steps as the CPU: grad_scale · (1 / count).
  const float g_scale = counted > 0 ? grad_scale * (1.0f / static_cast<float>(counted)) : 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * C;
    T* dx = dlogits != nullptr ? dlogits + r * C : nullptr;
    const int64_t label = static_cast<int64_t>(labels[r]);
    if (label == ignore_index) {
      if (dx != nullptr)
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dx[c] = store_as<T>(0.0f);
      if (threadIdx.x == 0) row_loss[r] = 0.0f;
      continue;  // uniform across the block: no thread skips a barrier another one reaches
    }
    const bool valid = label >= 0 && label < C;
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = fmaxf(mx, load_f32(x[c]));
    mx = block_allreduce_max(mx);
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += expf(load_f32(x[c]) - mx);
    sum = block_allreduce_sum(sum);
    if (threadIdx.x == 0) row_loss[r] = valid ? logf(sum) + mx - load_f32(x[label]) : NAN;
    if (dx != nullptr) {
      const float inv_sum = 1.0f / sum;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float p = expf(load_f32(x[c]) - mx) * inv_sum;
        dx[c] = store_as<T>(valid ? g_scale * (p - (c == label ? 1.0f : 0.0f)) : NAN);
      }
    }
  }
}

// ---- The classes split across ranks: one block per row in each step ----

template <typename T>
__global__ void local_max_kernel(const T* logits, int64_t rows, int64_t C, float* row_max) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * C;
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = fmaxf(mx, load_f32(x[c]));
    mx = block_allreduce_max(mx);
    if (threadIdx.x == 0) row_max[r] = mx;
  }
}

// sums[0, r] = sum of exp(x - row_max[r]) over these columns; sums[1, r] = the label's logit if
// it is one of them (nan for a label outside [0, total)).
template <typename T, typename L>
__global__ void local_sums_kernel(const T* logits, const L* labels, const float* row_max, int64_t rows, int64_t C,
                                  int64_t first, int64_t total, int64_t ignore_index, float* sums) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t label = static_cast<int64_t>(labels[r]);
    if (label == ignore_index) {
      if (threadIdx.x == 0) sums[r] = sums[rows + r] = 0.0f;
      continue;  // uniform across the block
    }
    const T* x = logits + r * C;
    const float mx = row_max[r];
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += expf(load_f32(x[c]) - mx);
    sum = block_allreduce_sum(sum);
    if (threadIdx.x == 0) {
      const int64_t column = label - first;
      sums[r] = sum;
      sums[rows + r] = label < 0 || label >= total ? NAN : column >= 0 && column < C ? load_f32(x[column]) : 0.0f;
    }
  }
}

// Each row's loss, log(sums[0]) + row_max - sums[1], and its dlogits for these columns.
template <typename T, typename L>
__global__ void from_sums_kernel(const T* logits, const L* labels, const float* row_max, const float* sums,
                                 int64_t rows, int64_t C, int64_t first, int64_t ignore_index, float grad_scale,
                                 const int* count, float* row_loss, T* dlogits) {
  const int counted = *count;
  const float g_scale = counted > 0 ? grad_scale * (1.0f / static_cast<float>(counted)) : 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t label = static_cast<int64_t>(labels[r]);
    const bool ignored = label == ignore_index;
    const float mx = row_max[r], sum = sums[r], picked = sums[rows + r];
    if (threadIdx.x == 0) row_loss[r] = ignored ? 0.0f : logf(sum) + mx - picked;
    if (dlogits == nullptr) continue;
    const T* x = logits + r * C;
    T* dx = dlogits + r * C;
    const float inv_sum = 1.0f / sum;
    const int64_t column = label - first;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float p = expf(load_f32(x[c]) - mx) * inv_sum;
      dx[c] = store_as<T>(ignored ? 0.0f : isnan(picked) ? NAN : g_scale * (p - (c == column ? 1.0f : 0.0f)));
    }
  }
}

// One block: loss = sum of row losses / count (0 when no row counts).
__global__ void finish_loss_kernel(const float* row_loss, int64_t rows, const int* count, float* loss) {
  double acc = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) acc += row_loss[r];
  acc = block_allreduce_sum(acc);
  if (threadIdx.x == 0) {
    const int counted = *count;
    *loss = counted > 0 ? static_cast<float>(acc / counted) : 0.0f;
  }
}

// One warp per row: argmax with the first maximum winning ties; hits are added per block
// then once per block to the global count.
template <typename T, typename L>
__global__ void count_correct_kernel(const T* logits, const L* labels, int64_t rows, int64_t C, int64_t ignore_index,
                                     unsigned long long* correct) {
  __shared__ unsigned int block_hits;
  if (threadIdx.x == 0) block_hits = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int64_t warps_per_grid = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps_per_grid) {
    const int64_t label = static_cast<int64_t>(labels[r]);
    if (label == ignore_index) continue;  // uniform across the warp
    const T* x = logits + r * C;
    float best = -INFINITY;
    int64_t best_index = C;  // C: none yet (an empty or all-nan row matches no label)
    for (int64_t c = lane; c < C; c += 32) {
      const float v = load_f32(x[c]);
      if (v > best || (best_index == C && v == best)) best = v, best_index = c;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int64_t other_index = __shfl_xor_sync(0xffffffffu, best_index, offset);
      if (other > best || (other == best && other_index < best_index)) best = other, best_index = other_index;
    }
    if (lane == 0 && best_index == label) atomicAdd(&block_hits, 1u);
  }
  __syncthreads();
  if (threadIdx.x == 0 && block_hits > 0) atomicAdd(correct, static_cast<unsigned long long>(block_hits));
}

// Calls f(L{}) with L the label type.
template <typename F>
void dispatch_labels(const Tensor& labels, F&& f) {
  if (labels.dtype() == DType::i32)
    f(std::int32_t{});
  else
    f(std::int64_t{});
}

int row_block_size(int64_t C) { return C >= 4096 ? 1024 : C >= 512 ? 256 : 128; }
// One block per row, the row kernels' grid-stride loops taking the rows past 2^30.
unsigned row_grid(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 1 << 30)); }

// The mean loss over the counted rows, as softmax_cross_entropy and cross_entropy_from_sums give
// it: 0 without rows; else, into stream-ordered scratch (the count, then the row losses, 16-byte
// aligned), one block counts the rows that are not ignore_index, row_losses(y, count, row_loss)
// launches the row kernel (y: the labels as their type), and one block sums the rows into loss
// in a fixed order.
template <typename F>
void mean_of_row_losses(const Tensor& loss, const Tensor& labels, int64_t ignore_index, cudaStream_t s,
                        F&& row_losses) {
  const int64_t rows = labels.numel();
  if (rows == 0) {
    TUTTI_CUDA_CHECK(cudaMemsetAsync(loss.data(), 0, sizeof(float), s));
    return;
  }
  StreamScratch scratch(16 + static_cast<std::size_t>(rows) * sizeof(float), s);
  int* count = scratch.as<int>();
  float* row_loss = reinterpret_cast<float*>(scratch.as<char>() + 16);
  dispatch_labels(labels, [&](auto label_tag) {
    using L = decltype(label_tag);
    const L* y = static_cast<const L*>(labels.data());
    count_rows_kernel<<<1, 1024, 0, s>>>(y, rows, ignore_index, count);
    TUTTI_CUDA_CHECK_LAUNCH("count_rows_kernel");
    row_losses(y, count, row_loss);
  });
  finish_loss_kernel<<<1, 1024, 0, s>>>(row_loss, rows, count, static_cast<float*>(loss.data()));
  TUTTI_CUDA_CHECK_LAUNCH("finish_loss_kernel");
}

}  // namespace

void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                           int64_t ignore_index, float grad_scale, const Stream& stream) {
  const int64_t rows = logits.dim(0), C = logits.dim(1);
  DeviceGuard guard(logits.device());
  const cudaStream_t s = native(stream);
  mean_of_row_losses(loss, labels, ignore_index, s, [&](const auto* y, int* count, float* row_loss) {
    detail::dispatch_floating("softmax_cross_entropy", logits.dtype(), [&](auto tag) {
      using H = decltype(tag);
      using T = device_t<H>;
      const unsigned grid = row_grid(rows);
      T* dx = dlogits.defined() ? ptr<H>(dlogits) : nullptr;
      softmax_xent_row_kernel<<<grid, row_block_size(C), 0, s>>>(ptr<H>(logits), y, rows, C, ignore_index, grad_scale,
                                                                 count, row_loss, dx);
      TUTTI_CUDA_CHECK_LAUNCH("softmax_xent_row_kernel");
    });
  });
}

void cross_entropy_local_max(const Tensor& logits, const Tensor& row_max, const Stream& stream) {
  const int64_t rows = logits.dim(0), C = logits.dim(1);
  if (rows == 0) return;
  DeviceGuard guard(logits.device());
  detail::dispatch_floating("cross_entropy_local_max", logits.dtype(), [&](auto tag) {
    using H = decltype(tag);
    const unsigned grid = row_grid(rows);
    local_max_kernel<<<grid, row_block_size(C), 0, native(stream)>>>(ptr<H>(logits), rows, C,
                                                                     static_cast<float*>(row_max.data()));
    TUTTI_CUDA_CHECK_LAUNCH("local_max_kernel");
  });
}

void cross_entropy_local_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                              const ClassColumns& columns, int64_t ignore_index, const Stream& stream) {
  const int64_t rows = logits.dim(0), C = logits.dim(1);
  if (rows == 0) return;
  DeviceGuard guard(logits.device());
  detail::dispatch_floating("cross_entropy_local_sums", logits.dtype(), [&](auto tag) {
    using H = decltype(tag);
    dispatch_labels(labels, [&](auto label_tag) {
      using L = decltype(label_tag);
      const unsigned grid = row_grid(rows);
      local_sums_kernel<<<grid, row_block_size(C), 0, native(stream)>>>(
          ptr<H>(logits), static_cast<const L*>(labels.data()), static_cast<const float*>(row_max.data()), rows, C,
          columns.first, columns.total, ignore_index, static_cast<float*>(sums.data()));
      TUTTI_CUDA_CHECK_LAUNCH("local_sums_kernel");
    });
  });
}

void cross_entropy_from_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                             const Tensor& loss, const Tensor& dlogits, const ClassColumns& columns,
                             int64_t ignore_index, float grad_scale, const Stream& stream) {
  const int64_t rows = logits.dim(0), C = logits.dim(1);
  DeviceGuard guard(logits.device());
  const cudaStream_t s = native(stream);
  mean_of_row_losses(loss, labels, ignore_index, s, [&](const auto* y, int* count, float* row_loss) {
    detail::dispatch_floating("cross_entropy_from_sums", logits.dtype(), [&](auto tag) {
      using H = decltype(tag);
      const unsigned grid = row_grid(rows);
      from_sums_kernel<<<grid, row_block_size(C), 0, s>>>(
          ptr<H>(logits), y, static_cast<const float*>(row_max.data()), static_cast<const float*>(sums.data()), rows, C,
          columns.first, ignore_index, grad_scale, count, row_loss, dlogits.defined() ? ptr<H>(dlogits) : nullptr);
      TUTTI_CUDA_CHECK_LAUNCH("from_sums_kernel");
    });
  });
}

void count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct, bool accumulate,
                   int64_t ignore_index, const Stream& stream) {
  const int64_t rows = logits.dim(0), C = logits.dim(1);
  DeviceGuard guard(logits.device());
  const cudaStream_t s = native(stream);
  if (!accumulate) TUTTI_CUDA_CHECK(cudaMemsetAsync(correct.data(), 0, sizeof(std::int64_t), s));
  if (rows == 0) return;
  constexpr int kBlock = 256, kRowsPerBlock = kBlock / 32;
  detail::dispatch_floating("count_correct", logits.dtype(), [&](auto tag) {
    using H = decltype(tag);
    dispatch_labels(labels, [&](auto label_tag) {
      using L = decltype(label_tag);
      const unsigned grid = grid_for((rows + kRowsPerBlock - 1) / kRowsPerBlock, 1, 16);
      // i64 counts are added as unsigned 64-bit (two's complement: the same bits).
      count_correct_kernel<<<grid, kBlock, 0, s>>>(ptr<H>(logits), static_cast<const L*>(labels.data()), rows, C,
                                                   ignore_index, static_cast<unsigned long long*>(correct.data()));
      TUTTI_CUDA_CHECK_LAUNCH("count_correct_kernel");
    });
  });
}

}  // namespace tutti::kernels::cuda
