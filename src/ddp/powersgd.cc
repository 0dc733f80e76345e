#include "powersgd.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "tutti/core/error.h"
#include "tutti/kernels/elementwise.h"
#include "tutti/kernels/linear.h"

namespace tutti::ddp {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A standard normal value, a function of (seed, stream, index) only: every rank draws the same.
float normal_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t h = splitmix64(seed ^ splitmix64(stream ^ splitmix64(index)));
  const double u1 = (static_cast<double>(h >> 40) + 1.0) / 16777217.0;  // (0, 1]
  const double u2 = static_cast<double>(h & 0xffffffULL) / 16777216.0;  // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

PowerSgd::PowerSgd(Communicator& comm, const nn::FlatPlan& plan, Tensor buffer, PowerSgdOptions options)
    : comm_(comm), options_(options), buffer_(std::move(buffer)) {
  const Device device = buffer_.device();
  buckets_.resize(plan.buckets.size());
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    Bucket& bucket = buckets_[b];
    std::int64_t p_numel = 0, q_numel = 0, e_numel = 0, plain_numel = 0;
    bool last_plain = false;
    for (std::size_t i : plan.buckets[b].entries) {
      const nn::PlanEntry& e = plan.entries[i];
      if (!e.requires_grad) {
        last_plain = false;
        continue;  // frozen: its gradient stays zero
      }
      if (e.shape.size() >= 2) {
        const std::int64_t n = e.shape[0];
        const std::int64_t m = e.numel / n;
        const std::int64_t r = std::min<std::int64_t>({options_.rank, n, m});
        if (static_cast<double>(n) * static_cast<double>(m) >
            options_.min_compression_ratio * static_cast<double>(r) * static_cast<double>(n + m)) {
          bucket.matrices.push_back(Matrix{i, n, m, r, e.offset, p_numel, q_numel, e_numel});
          p_numel += n * r;
          q_numel += m * r;
          e_numel += e.numel;
          last_plain = false;
          continue;
        }
      }
      if (last_plain) {  // adjacent to the last uncompressed range: one copy for both
        Plain& prev = bucket.plain.back();
        const std::int64_t end = e.offset + e.numel;
        plain_numel += end - (prev.offset + prev.numel);
        prev.numel = end - prev.offset;
      } else {
        bucket.plain.push_back(Plain{e.offset, e.numel, plain_numel});
        plain_numel += e.numel;
      }
      last_plain = true;
    }
    if (p_numel > 0) {
      bucket.p = Tensor::zeros({p_numel}, DType::f32, device);
      bucket.q = Tensor::zeros({q_numel}, DType::f32, device);
      if (options_.error_feedback) bucket.error = Tensor::zeros({e_numel}, DType::f32, device);
    }
    if (plain_numel > 0) bucket.plain_buf = Tensor::zeros({plain_numel}, DType::f32, device);
  }
}

PowerSgd::~PowerSgd() {
  // Collectives still in flight read the buffers (as the Reducer's destructor).
  for (Bucket& b : buckets_) {
    for (Work* w : {&b.p_work, &b.q_work, &b.plain_work}) {
      try {
        w->wait();
      } catch (...) {
      }
    }
  }
}

void PowerSgd::draw_q(Bucket& bucket, const Stream& stream) {
  // Warm start: one draw at the first compressed step; otherwise a new one each step.
  const std::uint64_t draw = options_.warm_start ? 0 : static_cast<std::uint64_t>(step_);
  Tensor host = Tensor::empty({bucket.q.numel()}, DType::f32, Device::cpu());
  float* q = host.data_as<float>();
  for (const Matrix& x : bucket.matrices) {
    const std::uint64_t stream_id = splitmix64(draw) ^ static_cast<std::uint64_t>(x.entry);
    for (std::int64_t k = 0; k < x.m * x.r; ++k) {
      q[x.q_offset + k] = normal_at(options_.seed, stream_id, static_cast<std::uint64_t>(k));
    }
  }
  bucket.q.copy_from(host, stream);
  if (bucket.q.device().is_cuda()) stream.synchronize();  // host is freed on return
}

std::int64_t PowerSgd::launch(int b, const Stream& stream) {
  Bucket& bucket = buckets_[static_cast<std::size_t>(b)];
  std::int64_t bytes = 0;
  CallOptions call;
  call.stream = stream;
  if (!bucket.plain.empty()) {
    for (const Plain& x : bucket.plain) {
      bucket.plain_buf.view(x.staged, {x.numel}).copy_from(buffer_.view(x.offset, {x.numel}), stream);
    }
    call.label = "powersgd plain, bucket " + std::to_string(b);
    bucket.plain_work = comm_.allreduce(bucket.plain_buf, ReduceOp::sum, call);
    bytes += static_cast<std::int64_t>(bucket.plain_buf.nbytes());
  }
  if (bucket.matrices.empty()) return bytes;
  if (!options_.warm_start || !bucket.q_drawn) {
    draw_q(bucket, stream);
    bucket.q_drawn = true;
  }
  for (const Matrix& x : bucket.matrices) {
    const Tensor mat = matrix_of(x);
    if (options_.error_feedback) {
      Tensor err = bucket.error.view(x.e_offset, {x.n, x.m});
      kernels::add(mat, err, mat, stream);  // M = grad + error
      err.copy_from(mat, stream);           // error = M, until the approximation is known
    }
    kernels::matmul(mat, false, bucket.q.view(x.q_offset, {x.m, x.r}), false, bucket.p.view(x.p_offset, {x.n, x.r}),
                    1.0f, 0.0f, stream);
  }
  call.label = "powersgd P, bucket " + std::to_string(b);
  bucket.p_work = comm_.allreduce(bucket.p, ReduceOp::sum, call);
  return bytes + static_cast<std::int64_t>(bucket.p.nbytes());
}

// Modified Gram-Schmidt on each P's columns, in double on the host. A column that is (near)
// zero after the earlier ones were taken out becomes zero: it adds nothing to P·P^T.
void PowerSgd::orthonormalize(Bucket& bucket, const Stream& stream) {
  const bool gpu = bucket.p.device().is_cuda();
  Tensor host = gpu ? bucket.p.to(Device::cpu(), stream) : bucket.p;
  if (gpu) stream.synchronize();
  float* p = host.data_as<float>();
  for (const Matrix& x : bucket.matrices) {
    const std::int64_t n = x.n, r = x.r;
    float* px = p + x.p_offset;
    work_.assign(static_cast<std::size_t>(n * r), 0.0);
    for (std::int64_t k = 0; k < n * r; ++k) work_[static_cast<std::size_t>(k)] = px[k];
    double scale = 0;  // the largest column norm, for a relative threshold of "zero"
    for (std::int64_t c = 0; c < r; ++c) {
      double norm = 0;
      for (std::int64_t k = 0; k < n; ++k)
        norm += work_[static_cast<std::size_t>(k * r + c)] * work_[static_cast<std::size_t>(k * r + c)];
      scale = std::max(scale, std::sqrt(norm));
    }
    for (std::int64_t c = 0; c < r; ++c) {
      auto at = [&](std::int64_t k, std::int64_t col) -> double& {
        return work_[static_cast<std::size_t>(k * r + col)];
      };
      for (std::int64_t j = 0; j < c; ++j) {
        double dot = 0;
        for (std::int64_t k = 0; k < n; ++k) dot += at(k, c) * at(k, j);
        for (std::int64_t k = 0; k < n; ++k) at(k, c) -= dot * at(k, j);
      }
      double norm = 0;
      for (std::int64_t k = 0; k < n; ++k) norm += at(k, c) * at(k, c);
      norm = std::sqrt(norm);
      const double inv = norm > 1e-12 * scale && norm > 0 ? 1.0 / norm : 0.0;
      for (std::int64_t k = 0; k < n; ++k) at(k, c) *= inv;
    }
    for (std::int64_t k = 0; k < n * r; ++k) px[k] = static_cast<float>(work_[static_cast<std::size_t>(k)]);
  }
  if (gpu) {
    bucket.p.copy_from(host, stream);
    stream.synchronize();  // host is freed on return
  }
}

std::int64_t PowerSgd::finish(const Stream& stream, double* run_ms) {
  std::int64_t bytes = 0;
  const float inv_n = 1.0f / static_cast<float>(comm_.size());
  // First every bucket's Q on the wire, then the products: bucket b's allreduce of Q runs
  // while the host orthonormalizes bucket b + 1.
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.matrices.empty()) continue;
    bucket.p_work.wait(stream);
    *run_ms += bucket.p_work.run_ms().value_or(0.0);
    bucket.p_work = Work();
    orthonormalize(bucket, stream);
    for (const Matrix& x : bucket.matrices) {
      kernels::matmul(matrix_of(x), true, bucket.p.view(x.p_offset, {x.n, x.r}), false,
                      bucket.q.view(x.q_offset, {x.m, x.r}), 1.0f, 0.0f, stream);
    }
    CallOptions call;
    call.stream = stream;
    call.label = "powersgd Q, bucket " + std::to_string(b);
    bucket.q_work = comm_.allreduce(bucket.q, ReduceOp::sum, call);
    bytes += static_cast<std::int64_t>(bucket.q.nbytes());
  }
  for (Bucket& bucket : buckets_) {
    if (!bucket.plain.empty()) {
      bucket.plain_work.wait(stream);
      *run_ms += bucket.plain_work.run_ms().value_or(0.0);
      bucket.plain_work = Work();
      for (const Plain& x : bucket.plain) {
        buffer_.view(x.offset, {x.numel}).copy_from(bucket.plain_buf.view(x.staged, {x.numel}), stream);
      }
    }
    if (bucket.matrices.empty()) continue;
    bucket.q_work.wait(stream);
    *run_ms += bucket.q_work.run_ms().value_or(0.0);
    bucket.q_work = Work();
    for (const Matrix& x : bucket.matrices) {
      const Tensor mat = matrix_of(x);
      // The sum over ranks of P·P^T·M = P·Q^T (Q summed): N times the averaged approximation.
      kernels::matmul(bucket.p.view(x.p_offset, {x.n, x.r}), false, bucket.q.view(x.q_offset, {x.m, x.r}), true, mat,
                      1.0f, 0.0f, stream);
      if (options_.error_feedback) {
        kernels::add_scaled(mat, -inv_n, bucket.error.view(x.e_offset, {x.n, x.m}), stream);  // M − P·Q^T / N
      }
    }
  }
  return bytes;
}

std::int64_t PowerSgd::bytes() const {
  std::int64_t total = 0;
  for (const Bucket& b : buckets_) {
    for (const Tensor* t : {&b.p, &b.q, &b.error, &b.plain_buf}) {
      if (t->defined()) total += static_cast<std::int64_t>(t->nbytes());
    }
  }
  return total;
}

std::int64_t PowerSgd::compressed_count() const {
  std::int64_t count = 0;
  for (const Bucket& b : buckets_) count += static_cast<std::int64_t>(b.matrices.size());
  return count;
}

std::int64_t PowerSgd::compressed_numel() const {
  std::int64_t numel = 0;
  for (const Bucket& b : buckets_) {
    for (const Matrix& x : b.matrices) numel += x.n * x.m;
  }
  return numel;
}

}  // namespace tutti::ddp
