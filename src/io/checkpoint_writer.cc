#include "tutti/io/checkpoint_writer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "io/checkpoint_file.h"
#include "tutti/core/trace.h"

namespace tutti::io {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One file to write: the plan and where its tensors' bytes are (the writer's buffers).
struct Job {
  std::string path;
  std::int64_t step = -1;
  detail::FilePlan plan;
  std::vector<const void*> data;
  StateDict kept;  // tensors handed over (save_handing_over): written where they are, freed after
  int rank = -1;   // the owner's error rank, for the messages of the background thread
};

// The GPU streams a snapshot's copies were issued on, each synchronized once.
class StreamSet {
 public:
  void add(const Stream& s) {
    for (const Stream& t : streams_) {
      if (t.device() == s.device() && t.native() == s.native()) return;
    }
    streams_.push_back(s);
  }
  void synchronize() const {
    for (const Stream& s : streams_) s.synchronize();
  }

 private:
  std::vector<Stream> streams_;
};

}  // namespace

struct CheckpointWriter::Impl {
  CheckpointWriterOptions options;

  // Host buffers of the snapshot: one allocation, each tensor at a 64-byte aligned offset.
  // Written by the owner only while no write is in flight; read by the worker during one.
  std::shared_ptr<Storage> buffer;

  std::mutex mutex;
  std::condition_variable changed;
  std::optional<Job> pending;  // handed over, not yet taken by the worker
  bool in_flight = false;      // from hand-over to the end of the write
  std::int64_t in_flight_step = -1;
  bool stopping = false;
  std::exception_ptr error;  // the first failed background write
  std::atomic<bool> failed{false};
  std::atomic<std::int64_t> last_written{-1};
  std::thread worker;

  void run_worker();
  void check_failed();  // check()
  static std::exception_ptr write(const Job& job, const CheckpointHooks& hooks) noexcept;
  SaveResult save_sync(const std::string& path, std::int64_t step, const StateDict& state,
                       const detail::FilePlan& plan);
  // Copies every tensor of `state` into the buffer, except the host tensors whose keys are in
  // `kept` (written where they are); data[i] is where the i-th one's bytes are.
  double copy_to_buffer(const StateDict& state, const detail::FilePlan& plan, const Stream& stream,
                        const StateDict& kept, std::vector<const void*>& data);
  SaveResult save(const std::string& path, std::int64_t step, const StateDict& state, StateDict kept,
                  const Metadata& metadata, const Stream& stream);
};

// ---- the background thread ---------------------------------------------------------------

std::exception_ptr CheckpointWriter::Impl::write(const Job& job, const CheckpointHooks& hooks) noexcept {
  try {
    set_thread_error_rank(job.rank);
    ErrorContext context("writing the checkpoint of step " + std::to_string(job.step) + " to '" + job.path +
                         "' in the background");
    try {
      if (hooks.before_write) hooks.before_write(job.step, job.path);
      detail::write_checkpoint_file(job.path, job.plan, job.data);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      TUTTI_THROW(Error, "checkpoint write failed: ", e.what());
    } catch (...) {
      TUTTI_THROW(Error, "checkpoint write failed with an exception that is not a std::exception");
    }
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

void CheckpointWriter::Impl::run_worker() {
  std::unique_lock lock(mutex);
  for (;;) {
    // A job handed over before the stop is still written: the destructor completes it.
    changed.wait(lock, [&] { return pending.has_value() || stopping; });
    if (!pending) return;
    Job job = std::move(*pending);
    pending.reset();
    lock.unlock();
    std::exception_ptr err = write(job, options.hooks);
    lock.lock();
    if (err) {
      if (!error) error = err;
      failed.store(true, std::memory_order_release);
    } else {
      last_written.store(job.step, std::memory_order_release);
    }
    in_flight = false;
    in_flight_step = -1;
    changed.notify_all();
  }
}

// ---- the owner's side --------------------------------------------------------------------

CheckpointWriter::CheckpointWriter(CheckpointWriterOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->changed.notify_all();
  if (impl_->worker.joinable()) impl_->worker.join();
}

void CheckpointWriter::check() { impl_->check_failed(); }

void CheckpointWriter::Impl::check_failed() {
  if (!failed.load(std::memory_order_acquire)) return;
  std::exception_ptr err;
  {
    std::lock_guard lock(mutex);
    err = error;
  }
  std::rethrow_exception(err);
}

void CheckpointWriter::finish() {
  {
    std::unique_lock lock(impl_->mutex);
    impl_->changed.wait(lock, [&] { return !impl_->in_flight; });
  }
  check();
}

bool CheckpointWriter::busy() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->in_flight;
}

std::int64_t CheckpointWriter::last_written_step() const { return impl_->last_written.load(std::memory_order_acquire); }

std::uint64_t CheckpointWriter::buffer_bytes() const { return impl_->buffer ? impl_->buffer->nbytes() : 0; }

const CheckpointWriterOptions& CheckpointWriter::options() const { return impl_->options; }

SaveResult CheckpointWriter::Impl::save_sync(const std::string& path, std::int64_t step, const StateDict& state,
                                             const detail::FilePlan& plan) {
  SaveResult r;
  r.step = step;
  r.file_bytes = plan.file_size;
  auto t0 = std::chrono::steady_clock::now();
  const detail::HostData host = detail::host_data(state);  // as save_checkpoint
  r.copy_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  if (options.hooks.before_write) options.hooks.before_write(step, path);
  detail::write_checkpoint_file(path, plan, host.data);
  r.write_s = seconds_since(t0);
  last_written.store(step, std::memory_order_release);
  r.started = true;
  return r;
}

double CheckpointWriter::Impl::copy_to_buffer(const StateDict& state, const detail::FilePlan& plan,
                                              const Stream& stream, const StateDict& kept,
                                              std::vector<const void*>& data) {
  const auto t0 = std::chrono::steady_clock::now();
  auto is_kept = [&](const std::string& name, const Tensor& t) { return t.device().is_cpu() && kept.count(name) == 1; };
  std::uint64_t total = 0;
  std::size_t i = 0;
  for (const auto& [name, t] : state) {
    if (!is_kept(name, t)) total += detail::align_up(plan.nbytes[i]);
    ++i;
  }
  if (total > 0 && (!buffer || buffer->nbytes() < total)) {
    buffer.reset();  // free the old one first: both need not fit at once
    buffer = Storage::allocate(static_cast<std::size_t>(std::max<std::uint64_t>(total, detail::kAlign)), Device::cpu(),
                               options.pinned);
  }
  auto* base = total > 0 ? static_cast<unsigned char*>(buffer->data()) : nullptr;
  StreamSet streams;
  std::uint64_t at = 0;
  data.clear();
  for (const auto& [name, t] : state) {
    if (is_kept(name, t)) {
      data.push_back(t.nbytes() == 0 ? nullptr : t.data());
      continue;
    }
    unsigned char* dst = base + at;
    data.push_back(dst);
    at += detail::align_up(t.nbytes());
    if (t.nbytes() == 0) continue;
    if (t.device().is_cpu()) {
      std::memcpy(dst, t.data(), t.nbytes());
      continue;
    }
    // Pinned destination: the copy is asynchronous on the stream, waited for below.
    const Stream s = stream.device() == t.device() ? stream : Stream::default_for(t.device());
    Tensor::wrap(dst, t.shape(), t.dtype(), Device::cpu()).copy_from(t, s);
    streams.add(s);
  }
  streams.synchronize();
  return seconds_since(t0);
}

SaveResult CheckpointWriter::save(const std::string& path, std::int64_t step, const StateDict& state,
                                  const Metadata& metadata, const Stream& stream) {
  return impl_->save(path, step, state, {}, metadata, stream);
}

SaveResult CheckpointWriter::save_handing_over(const std::string& path, std::int64_t step, const StateDict& state,
                                               StateDict handed_over, const Metadata& metadata, const Stream& stream) {
  StateDict all = state;
  for (const auto& [key, t] : handed_over) {
    TUTTI_CHECK_ARG(all.emplace(key, t).second, "CheckpointWriter::save_handing_over: '", key,
                    "' is both in the state and in the state handed over");
  }
  return impl_->save(path, step, all, std::move(handed_over), metadata, stream);
}

SaveResult CheckpointWriter::Impl::save(const std::string& path, std::int64_t step, const StateDict& state,
                                        StateDict kept, const Metadata& metadata, const Stream& stream) {
  check_failed();
  Impl& m = *this;
  std::optional<trace::Span> span;
  if (trace::on()) span.emplace("checkpoint save", "checkpoint");
  ErrorContext context("saving the checkpoint of step " + std::to_string(step) + " to '" + path + "'");
  TUTTI_CHECK_ARG(!path.empty(), "CheckpointWriter::save: empty path");
  // Every entry checked before anything is copied, waited for or written.
  detail::FilePlan plan = detail::plan_checkpoint(state, metadata, "CheckpointWriter::save");
  if (m.options.mode == CheckpointMode::sync) return m.save_sync(path, step, state, plan);

  SaveResult r;
  r.step = step;
  {
    std::unique_lock lock(m.mutex);
    if (m.in_flight) {
      r.busy_step = m.in_flight_step;
      if (m.options.when_busy == WhenBusy::skip) {
        r.skipped = true;
        return r;
      }
      lock.unlock();
      if (m.options.hooks.before_wait) m.options.hooks.before_wait(r.busy_step);
      const auto t0 = std::chrono::steady_clock::now();
      lock.lock();
      m.changed.wait(lock, [&] { return !m.in_flight; });
      r.waited_s = seconds_since(t0);
    }
  }
  check_failed();  // the write waited for may have failed

  Job job;
  job.path = path;
  job.step = step;
  job.rank = error_rank();
  r.copy_s = m.copy_to_buffer(state, plan, stream, kept, job.data);
  job.kept = std::move(kept);
  r.file_bytes = plan.file_size;
  job.plan = std::move(plan);
  if (!m.worker.joinable()) m.worker = std::thread([&m] { m.run_worker(); });
  {
    std::lock_guard lock(m.mutex);
    m.pending = std::move(job);
    m.in_flight = true;
    m.in_flight_step = step;
  }
  m.changed.notify_all();
  r.started = true;
  return r;
}

}  // namespace tutti::io
