#include "tutti/ddp/reducer.h"

#include <algorithm>

#include "tutti/core/error.h"
#include "tutti/kernels/cast.h"
#include "tutti/kernels/elementwise.h"

namespace tutti::ddp {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Gradient offsets are multiples of this many elements: 16-byte (and for f32, 32-byte)
// aligned views, so the vectorized kernels take their fast path on every gradient.
constexpr std::int64_t kAlignElements = 8;

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

bool is_half(DType d) { return d == DType::f16 || d == DType::bf16; }

}  // namespace

Reducer::Reducer(Communicator& comm, std::vector<GradientSpec> specs, DType grad_dtype, Device device,
                 ReducerOptions options)
    : comm_(comm), specs_(std::move(specs)), options_(options), device_(device) {
  TUTTI_CHECK_ARG(is_floating(grad_dtype), "Reducer: gradient dtype must be f32, f16 or bf16, got ",
                  name_of(grad_dtype));
  TUTTI_CHECK_ARG(is_floating(options_.grad_comm_dtype), "Reducer: grad_comm_dtype must be f32, f16 or bf16, got ",
                  name_of(options_.grad_comm_dtype));
  TUTTI_CHECK_ARG(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
                  "Reducer: bucket caps must be positive, got bucket_cap_mb=", options_.bucket_cap_mb,
                  " first_bucket_cap_mb=", options_.first_bucket_cap_mb);
  device_.require_available();

  // Reverse order: backward writes the last layers' gradients first, so they go in the
  // first bucket and its allreduce can start while earlier layers are still computing.
  const std::size_t n = specs_.size();
  const double elem = static_cast<double>(size_of(grad_dtype));
  offsets_.assign(n, 0);
  bucket_of_.assign(n, 0);
  std::int64_t end = 0;
  double cap_bytes = options_.first_bucket_cap_mb * 1024 * 1024;
  Bucket current;
  for (std::size_t k = n; k-- > 0;) {
    const std::int64_t numel = numel_of(specs_[k].shape);
    const std::int64_t start = round_up(end, kAlignElements);
    const bool full = !current.grads.empty() && static_cast<double>(start + numel - current.offset) * elem > cap_bytes;
    if (full) {
      buckets_.push_back(std::move(current));
      current = Bucket();
      cap_bytes = options_.bucket_cap_mb * 1024 * 1024;
    }
    if (current.grads.empty()) current.offset = start;
    offsets_[k] = start;
    end = start + numel;
    current.grads.push_back(k);
    current.numel = end - current.offset;
    bucket_of_[k] = static_cast<int>(buckets_.size());
  }
  if (!current.grads.empty()) buckets_.push_back(std::move(current));

  buffer_ = Tensor::zeros({end}, grad_dtype, device_);
  if (options_.grad_comm_dtype != grad_dtype) {
    for (Bucket& b : buckets_) b.staging = Tensor::empty({b.numel}, options_.grad_comm_dtype, device_);
  }
  found_ = Tensor::zeros({1}, DType::i32, device_);
  marked_.assign(n, false);
}

Reducer::~Reducer() {
  // Collectives still in flight read the buffer: let them finish before it is freed.
  for (Bucket& b : buckets_) {
    try {
      if (b.launched) b.work.wait();
    } catch (...) {
    }
  }
}

Tensor Reducer::grad(std::size_t i) const {
  TUTTI_CHECK_ARG(i < specs_.size(), "Reducer::grad: index ", i, " out of range (", specs_.size(), " gradients)");
  return buffer_.view(offsets_[i], specs_[i].shape);
}

void Reducer::prepare(bool sync, const Stream& stream) {
  // A communicating pass that got under way must be finished: its buckets are in flight, or
  // summed but not yet averaged and checked. (One abandoned before any gradient, after an
  // error in backward, may start over.)
  const bool started = launched_any_ || std::any_of(marked_.begin(), marked_.end(), [](bool m) { return m; });
  TUTTI_CHECK(!(in_pass_ && sync_ && started), "Reducer::prepare: the previous synchronized pass was never "
              "finished: call finish() after the last mark_ready() of a pass prepared with sync = true");
  sync_ = sync;
  in_pass_ = true;
  stream_ = stream;
  next_to_launch_ = 0;
  launched_any_ = false;
  stats_ = StepStats();
  t_prepare_ = Clock::now();
  std::fill(marked_.begin(), marked_.end(), false);
  for (Bucket& b : buckets_) {
    b.launched = false;
    b.work = Work();
    b.pending = 0;
    for (std::size_t i : b.grads) {
      if (specs_[i].requires_grad) ++b.pending;
    }
  }
  // A bucket of frozen weights only is ready from the start.
  if (sync_ && options_.overlap) launch_ready_buckets();
}

void Reducer::mark_ready(std::size_t i) {
  TUTTI_CHECK_ARG(i < specs_.size(), "Reducer::mark_ready: index ", i, " out of range (", specs_.size(), " gradients)");
  TUTTI_CHECK(in_pass_, "Reducer::mark_ready('", specs_[i].name, "') outside a backward pass (call prepare first)");
  TUTTI_CHECK(!marked_[i], "Reducer::mark_ready: gradient '", specs_[i].name,
              "' was marked ready twice in one backward pass (a parameter used twice must be marked once, "
              "after its last gradient kernel)");
  marked_[i] = true;
  if (!sync_ || !specs_[i].requires_grad) return;
  Bucket& b = buckets_[static_cast<std::size_t>(bucket_of_[i])];
  --b.pending;
  if (options_.overlap) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  // In bucket order only: the same order on every rank, whatever order gradients arrive in.
  while (next_to_launch_ < bucket_count() && buckets_[static_cast<std::size_t>(next_to_launch_)].pending == 0) {
    launch(buckets_[static_cast<std::size_t>(next_to_launch_)], next_to_launch_);
    ++next_to_launch_;
  }
}

void Reducer::launch(Bucket& b, int index) {
  Tensor wire = buffer_.view(b.offset, {b.numel});
  if (b.staging.defined()) {
    kernels::cast(wire, b.staging, stream_);
    wire = b.staging;
  }
  // A half sum of N gradients can overflow where their average would not: divide first.
  if (options_.average && is_half(wire.dtype()) && comm_.size() > 1) {
    kernels::scale(wire, 1.0f / static_cast<float>(comm_.size()), wire, stream_);
  }
  CallOptions call;
  call.label = "ddp bucket " + std::to_string(index);
  call.stream = stream_;
  if (!launched_any_) {
    t_first_launch_ = Clock::now();
    launched_any_ = true;
  }
  b.work = comm_.allreduce(wire, ReduceOp::sum, call);
  b.launched = true;
  stats_.bytes_reduced += static_cast<std::int64_t>(wire.nbytes());
}

void Reducer::throw_unready() const {
  std::string names;
  int count = 0;
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (!specs_[i].requires_grad || marked_[i]) continue;
    if (count < 8) names += (count ? ", '" : "'") + specs_[i].name + "'";
    ++count;
  }
  if (count > 8) names += ", ...";
  TUTTI_THROW(Error, "DistributedDataParallel: ", count, " parameter(s) received no gradient in this backward pass: ",
              names, ". Their buckets cannot be reduced. If some parameters are unused on purpose, set "
              "allow_unused_parameters (their gradient then counts as zero)");
}

const Tensor& Reducer::finish(double divisor) {
  TUTTI_CHECK(in_pass_ && sync_, "Reducer::finish: no synchronized backward pass to finish (prepare(true) first)");
  TUTTI_CHECK_ARG(divisor > 0, "Reducer::finish: divisor must be positive, got ", divisor);
  ErrorContext context("finishing the gradient reduction of " + std::to_string(bucket_count()) + " bucket(s)");
  const Clock::time_point t_finish = Clock::now();

  // What backward did not launch: everything when overlap is off, unused gradients otherwise.
  for (int i = next_to_launch_; i < bucket_count(); ++i) {
    Bucket& b = buckets_[static_cast<std::size_t>(i)];
    if (b.pending > 0 && !options_.allow_unused) throw_unready();
  }
  for (; next_to_launch_ < bucket_count(); ++next_to_launch_) {
    launch(buckets_[static_cast<std::size_t>(next_to_launch_)], next_to_launch_);
  }
  for (Bucket& b : buckets_) b.work.wait(stream_);
  const Clock::time_point t_done = Clock::now();

  // One fused pass per bucket: divide and check. Scaling by 1/(N · divisor) after the sum
  // (or 1/divisor after a half reduction that already divided by N).
  const bool prescaled = options_.average && is_half(options_.grad_comm_dtype) && comm_.size() > 1;
  double factor = 1.0 / divisor;
  if (options_.average && !prescaled) factor /= comm_.size();
  found_.zero(stream_);
  for (Bucket& b : buckets_) {
    Tensor view = buffer_.view(b.offset, {b.numel});
    if (b.staging.defined()) kernels::cast(b.staging, view, stream_);
    kernels::unscale_and_check(view, static_cast<float>(factor), found_, stream_);
  }
  in_pass_ = false;

  const Clock::time_point t_end = Clock::now();
  stats_.buckets = bucket_count();
  stats_.backward_ms = ms_between(t_prepare_, t_finish);
  stats_.exposed_comm_ms = ms_between(t_finish, t_done);
  stats_.comm_ms = launched_any_ ? ms_between(t_first_launch_, t_done) : 0.0;
  stats_.finish_ms = ms_between(t_finish, t_end);
  for (const Bucket& b : buckets_) stats_.comm_run_ms += b.work.run_ms().value_or(0.0);
  const int n = comm_.size();
  const double busy_ms = stats_.comm_run_ms > 0 ? stats_.comm_run_ms : stats_.comm_ms;
  if (busy_ms > 0 && n > 1) {
    stats_.busbw_gbs = static_cast<double>(stats_.bytes_reduced) * 2.0 * (n - 1) / n / (busy_ms * 1e-3) / 1e9;
  }
  return found_;
}

void Reducer::zero() { buffer_.zero(stream_); }

}  // namespace tutti::ddp
