// The Communicator base (argument checks, sequence numbers, the loud defaults), Work,
// CommOptions, and what the backends share (timeout report, fingerprints).
#include "tutti/comm/communicator.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/backend.h"
#include "comm/fault.h"
#include "comm/work_state.h"
#include "core/format_bytes.h"
#include "tutti/core/trace.h"

namespace tutti {

std::string_view name_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

std::string_view name_of(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::allreduce: return "allreduce";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::allgather: return "allgather";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::sendrecv: return "sendrecv";
  }
  return "?";
}

namespace {

// What every rank must agree on (the label may differ), and sendrecv's peers where known
// (they differ per rank; a fingerprint does not carry them).
std::string describe(std::uint64_t seq, CollectiveKind kind, ReduceOp op, DType dtype, std::int64_t count, int root,
                     int send_to = -1, int recv_from = -1) {
  std::ostringstream s;
  s << '#' << seq << ' ' << name_of(kind);
  if (kind == CollectiveKind::allreduce || kind == CollectiveKind::reduce_scatter) s << '(' << name_of(op) << ')';
  if (kind == CollectiveKind::broadcast) s << "(root " << root << ')';
  if (kind == CollectiveKind::sendrecv && send_to >= 0) s << "(to " << send_to << ", from " << recv_from << ')';
  if (kind != CollectiveKind::barrier) {
    s << ' ' << count << " x " << name_of(dtype) << " ("
      << detail::format_bytes(static_cast<double>(count) * static_cast<double>(size_of(dtype)), 1) << ')';
  }
  return s.str();
}

std::optional<double> env_double(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  TUTTI_CHECK_ARG(errno == 0 && end != v && *end == '\0' && x > 0, "environment variable ", name, "='", v,
                  "' is not a positive number of seconds");
  return x;
}

}  // namespace

std::string CollectiveInfo::str() const {
  std::string s = describe(seq, kind, op, dtype, count, root, send_to, recv_from);
  if (!label.empty()) s += " issued by '" + label + "'";
  return s;
}

double CommOptions::timeout_seconds() const {
  if (timeout) {
    TUTTI_CHECK_ARG(timeout->count() > 0, "CommOptions::timeout must be positive, got ", timeout->count(), " s");
    return timeout->count();
  }
  if (auto env = env_double("TUTTI_TIMEOUT_S")) return *env;
  return 300.0;
}

bool CommOptions::debug_enabled() const {
  if (debug) return *debug;
  const char* v = std::getenv("TUTTI_DEBUG");
  if (v == nullptr || *v == '\0') return false;
  const std::string s = v;
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  TUTTI_THROW(InvalidArgument, "environment variable TUTTI_DEBUG='", s, "' is not 1 or 0");
}

// ---- Work ---------------------------------------------------------------------------------

bool Work::test() const { return state_ ? state_->test() : true; }
void Work::wait() const {
  if (state_) state_->wait();
}
void Work::wait(const Stream& stream) const {
  if (state_) state_->wait(stream);
}
const CollectiveInfo& Work::info() const {
  static const CollectiveInfo none{};
  return state_ ? state_->info() : none;
}

std::optional<double> Work::run_ms() const {
  if (!state_ || !state_->test()) return std::nullopt;
  const double ms = state_->run_ms();
  return ms >= 0 ? std::optional<double>(ms) : std::nullopt;
}

namespace detail {

namespace {
std::string collective_args(const CollectiveInfo& info, std::string_view backend) {
  const std::int64_t bytes = info.count * static_cast<std::int64_t>(size_of(info.dtype));
  std::string args = "\"seq\":" + std::to_string(info.seq) + ",\"kind\":\"" + std::string(name_of(info.kind)) + "\"";
  if (info.kind == CollectiveKind::allreduce || info.kind == CollectiveKind::reduce_scatter) {
    args += ",\"op\":\"" + std::string(name_of(info.op)) + "\"";
  }
  if (info.kind == CollectiveKind::sendrecv) {
    args += ",\"send_to\":" + std::to_string(info.send_to) + ",\"recv_from\":" + std::to_string(info.recv_from);
  }
  args += ",\"count\":" + std::to_string(info.count) + ",\"dtype\":\"" + std::string(name_of(info.dtype)) +
          "\",\"bytes\":" + std::to_string(bytes) + ",\"backend\":\"" + std::string(backend) + "\"";
  return args;
}
std::string collective_name(const CollectiveInfo& info) {
  return info.label.empty() ? std::string(name_of(info.kind)) : info.label;
}
}  // namespace

void trace_collective(const CollectiveInfo& info, std::string_view backend, std::int64_t start_ns,
                      std::int64_t end_ns) {
  std::string args = collective_args(info, backend);
  if (start_ns > 0 && info.issued_ns > 0) {
    args += ",\"issued_to_start_us\":" + std::to_string((start_ns - info.issued_ns) / 1000);
  }
  trace::record(collective_name(info), "comm", trace::Lane::comm, start_ns > 0 ? start_ns : info.issued_ns, end_ns,
                std::move(args),
                /*force=*/true);
}

void trace_collective_on_device(const CollectiveInfo& info, const Event& begin, const Event& end) {
  trace::record_device(collective_name(info), "comm", trace::Lane::comm, begin, end, collective_args(info, "nccl"));
}

Work HostWork::failed(CollectiveInfo info, std::exception_ptr error) {
  auto state = std::make_shared<HostWork>(std::move(info));
  state->fail(std::move(error));
  return Work(state);
}

// complete() is the hot path: no lock unless a waiter sleeps. The waiter publishes
// has_sleeper_ before it checks the status, and complete() publishes the status before it
// checks has_sleeper_ (both sequentially consistent), so one of them sees the other.
void HostWork::complete() {
  int expected = kPending;
  if (!status_.compare_exchange_strong(expected, kDone)) return;
  if (has_sleeper_.load()) {
    std::lock_guard lock(mutex_);
    cv_.notify_all();
  }
}

void HostWork::fail(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    if (status_.load() != kPending) return;
    error_ = std::move(error);  // before the status says kFailed
    int expected = kPending;
    if (!status_.compare_exchange_strong(expected, kFailed)) return;  // complete() won
  }
  if (has_sleeper_.load()) cv_.notify_all();
}

void HostWork::rethrow_if_failed() const {
  if (status_.load(std::memory_order_acquire) == kFailed) {
    std::lock_guard lock(mutex_);
    std::rethrow_exception(error_);
  }
}

bool HostWork::test() {
  if (!finished()) return false;
  rethrow_if_failed();
  return true;
}

void HostWork::wait() {
  if (!finished()) {
    if (auto runner = runner_.lock()) runner->run_until(*this);
  }
  // Spin for a few tens of microseconds, yielding so that a communication thread that
  // shares the core can run.
  if (!finished()) {
    const auto spin_until = Clock::now() + std::chrono::microseconds(50);
    while (!finished() && Clock::now() < spin_until) std::this_thread::yield();
  }
  if (!finished()) {
    std::unique_lock lock(mutex_);
    has_sleeper_.store(true);
    cv_.wait(lock, [&] { return status_.load() != kPending; });
  }
  rethrow_if_failed();
}

// ---- shared by the backends -----------------------------------------------------------

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::exception_ptr timeout_error(const std::string& report) {
  return std::make_exception_ptr(TimeoutError(report, strip_path(__FILE__), error_rank()));
}

std::exception_ptr in_context(std::exception_ptr error, const std::string& what) {
  auto rebuild = [&](const auto& e) {
    using E = std::decay_t<decltype(e)>;
    return std::make_exception_ptr(E(e.message() + " (while " + what + ")", e.where(), e.rank()));
  };
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    return rebuild(e);
  } catch (const InvalidArgument& e) {
    return rebuild(e);
  } catch (const BackendError& e) {
    return rebuild(e);
  } catch (const Error& e) {
    return rebuild(e);
  } catch (...) {
    return error;
  }
}

Fingerprint fingerprint_of(const CollectiveInfo& info) {
  return Fingerprint{info.seq,
                     info.count,
                     static_cast<std::int32_t>(info.kind),
                     static_cast<std::int32_t>(info.op),
                     static_cast<std::int32_t>(info.dtype),
                     info.root};
}

bool same(const Fingerprint& a, const Fingerprint& b) {
  return a.seq == b.seq && a.count == b.count && a.kind == b.kind && a.op == b.op && a.dtype == b.dtype &&
         a.root == b.root;
}

namespace {
std::string describe(const Fingerprint& f) {
  if (f.kind < 0 || f.kind > static_cast<int>(CollectiveKind::sendrecv) || f.dtype < 0 ||
      f.dtype > static_cast<int>(DType::i64) || f.op < 0 || f.op > static_cast<int>(ReduceOp::min)) {
    return "an unknown collective";
  }
  return tutti::describe(f.seq, static_cast<CollectiveKind>(f.kind), static_cast<ReduceOp>(f.op),
                         static_cast<DType>(f.dtype), f.count, f.root);
}
}  // namespace

[[noreturn]] void throw_mismatch(const std::vector<Fingerprint>& all) {
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (!same(all[r], all[0])) {
      TUTTI_THROW(InvalidArgument, "collective mismatch: rank 0 issued ", describe(all[0]), " but rank ", r, " issued ",
                  describe(all[r]), "; every rank must issue the same collectives in the same order");
    }
  }
  TUTTI_THROW(InvalidArgument,
              "collective mismatch: the ranks' fingerprints differ, but no two of them do (a rank "
              "changed its mind?)");
}

std::size_t largest_message_bytes(const CollectiveInfo& info, int world_size) {
  const bool half = info.dtype == DType::f16 || info.dtype == DType::bf16;
  const bool reduces = info.kind == CollectiveKind::allreduce || info.kind == CollectiveKind::reduce_scatter;
  const std::size_t es = half && reduces ? 4 : size_of(info.dtype);
  const auto n = static_cast<std::size_t>(std::max<std::int64_t>(info.count, 0));
  switch (info.kind) {
    case CollectiveKind::allreduce:
    case CollectiveKind::broadcast:
    case CollectiveKind::sendrecv: return n * es;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::allgather: return n * es * static_cast<std::size_t>(std::max(world_size, 1));
    case CollectiveKind::barrier: return 0;
  }
  return 0;
}

void agree(ControlChannel& channel, const CollectiveInfo& info) {
  const std::vector<Fingerprint> all = channel.agree(fingerprint_of(info));
  if (!all.empty()) throw_mismatch(all);
}

bool agree_polled(ControlChannel& channel, const CollectiveInfo& info, double timeout_s) {
  const auto start = Clock::now();
  // A pending agreement dropped on timeout leaves the channel unusable (control.h): the
  // communicator is broken then anyway.
  std::unique_ptr<PendingAgreement> pending = channel.start_agree(fingerprint_of(info));
  while (!pending->test()) {
    if (seconds_since(start) > timeout_s) return false;
    std::this_thread::yield();
  }
  const std::vector<Fingerprint> all = pending->result();
  if (!all.empty()) throw_mismatch(all);
  return true;
}

}  // namespace detail

// ---- Communicator -------------------------------------------------------------------------

Communicator::Communicator(int rank, int size, CommOptions options)
    : rank_(rank),
      size_(size),
      options_(std::move(options)),
      timeout_s_(options_.timeout_seconds()),
      debug_(options_.debug_enabled()) {
  options_.timeout = std::chrono::duration<double>(timeout_s_);
  options_.debug = debug_;
}

Communicator::~Communicator() = default;

void Communicator::unsupported(std::string_view what) const {
  TUTTI_THROW(BackendError, "Backend ", backend(), " does not support ", what);
}

Work Communicator::do_allreduce(Collective) { unsupported("allreduce"); }
Work Communicator::do_reduce_scatter(Collective) { unsupported("reduce_scatter"); }
Work Communicator::do_allgather(Collective) { unsupported("allgather"); }
Work Communicator::do_broadcast(Collective) { unsupported("broadcast"); }
Work Communicator::do_barrier(Collective) { unsupported("barrier"); }
Work Communicator::do_sendrecv(Collective) { unsupported("sendrecv"); }
void Communicator::check_device(Device, const CollectiveInfo&) const {}

CollectiveInfo Communicator::make_info(CollectiveKind kind, ReduceOp op, DType dtype, std::int64_t count, int root,
                                       const CallOptions& call) const {
  CollectiveInfo info;
  info.kind = kind;
  info.op = op;
  info.dtype = dtype;
  info.count = count;
  info.root = root;
  info.label = call.label;
  return info;
}

void Communicator::check_tensor(const char* role, const Tensor& t, const CollectiveInfo& info) const {
  TUTTI_CHECK_ARG(t.defined(), name_of(info.kind), ": ", role, " is an undefined tensor");
  check_device(t.device(), info);
}

Communicator::Collective Communicator::make_collective(CollectiveInfo info, Tensor input, Tensor output,
                                                       const CallOptions& call) const {
  const Tensor& any = output.defined() ? output : input;
  if (any.defined()) {
    if (input.defined()) {
      TUTTI_CHECK_ARG(input.dtype() == output.dtype(), name_of(info.kind), ": input is ", input.str(),
                      " but output is ", output.str(), " (dtypes must match)");
      TUTTI_CHECK_ARG(input.device() == output.device(), name_of(info.kind), ": input is on ", input.device().str(),
                      " but output on ", output.device().str());
    }
    if (info.kind == CollectiveKind::allreduce || info.kind == CollectiveKind::reduce_scatter) {
      TUTTI_CHECK_ARG(info.op != ReduceOp::avg || is_floating(any.dtype()), name_of(info.kind),
                      ": ReduceOp::avg is defined for float dtypes only, got ", name_of(any.dtype()),
                      " (use sum and divide as your integers need)");
    }
  }
  Stream stream = call.stream;
  if (any.defined() && any.device().is_cuda()) {
    if (!stream.device().is_cuda()) stream = Stream::default_for(any.device());
    TUTTI_CHECK_ARG(stream.device() == any.device(), name_of(info.kind), ": tensors on ", any.device().str(),
                    " but CallOptions::stream on ", stream.device().str());
  }
  return Collective{std::move(info), std::move(input), std::move(output), std::move(stream)};
}

Work Communicator::issue(Collective c, Work (Communicator::*run)(Collective)) {
  detail::inject_fault(detail::FaultPoint::collective);
  std::lock_guard lock(issue_mutex_);
  c.info.seq = next_seq_++;
  if (trace::on()) c.info.issued_ns = trace::now_ns();
  return (this->*run)(std::move(c));
}

Work Communicator::allreduce(const Tensor& tensor, ReduceOp op, const CallOptions& call) {
  return allreduce(tensor, tensor, op, call);
}

Work Communicator::allreduce(const Tensor& input, const Tensor& output, ReduceOp op, const CallOptions& call) {
  CollectiveInfo info = make_info(CollectiveKind::allreduce, op, output.dtype(), output.numel(), -1, call);
  check_tensor("input", input, info);
  check_tensor("output", output, info);
  TUTTI_CHECK_ARG(input.numel() == output.numel(), "allreduce: input ", input.str(), " and output ", output.str(),
                  " differ in size");
  return issue(make_collective(std::move(info), input, output, call), &Communicator::do_allreduce);
}

Work Communicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op, const CallOptions& call) {
  CollectiveInfo info = make_info(CollectiveKind::reduce_scatter, op, output.dtype(), output.numel(), -1, call);
  check_tensor("input", input, info);
  check_tensor("output", output, info);
  TUTTI_CHECK_ARG(input.numel() == output.numel() * size_, "reduce_scatter: input ", input.str(),
                  " must hold world size (", size_, ") x output ", output.str(), " elements");
  return issue(make_collective(std::move(info), input, output, call), &Communicator::do_reduce_scatter);
}

Work Communicator::allgather(const Tensor& input, const Tensor& output, const CallOptions& call) {
  CollectiveInfo info = make_info(CollectiveKind::allgather, ReduceOp::sum, input.dtype(), input.numel(), -1, call);
  check_tensor("input", input, info);
  check_tensor("output", output, info);
  TUTTI_CHECK_ARG(output.numel() == input.numel() * size_, "allgather: output ", output.str(),
                  " must hold world size (", size_, ") x input ", input.str(), " elements");
  return issue(make_collective(std::move(info), input, output, call), &Communicator::do_allgather);
}

Work Communicator::broadcast(const Tensor& tensor, int root, const CallOptions& call) {
  return broadcast(tensor, tensor, root, call);
}

Work Communicator::broadcast(const Tensor& input, const Tensor& output, int root, const CallOptions& call) {
  CollectiveInfo info = make_info(CollectiveKind::broadcast, ReduceOp::sum, output.dtype(), output.numel(), root, call);
  TUTTI_CHECK_ARG(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of a world of ", size_);
  check_tensor("output", output, info);
  Tensor in;
  if (rank_ == root) {
    check_tensor("input (on the root)", input, info);
    TUTTI_CHECK_ARG(input.numel() == output.numel(), "broadcast: input ", input.str(), " and output ", output.str(),
                    " differ in size");
    in = input;
  }
  return issue(make_collective(std::move(info), in, output, call), &Communicator::do_broadcast);
}

Work Communicator::barrier(const CallOptions& call) {
  CollectiveInfo info = make_info(CollectiveKind::barrier, ReduceOp::sum, DType::f32, 0, -1, call);
  return issue(make_collective(std::move(info), Tensor(), Tensor(), call), &Communicator::do_barrier);
}

// The peers are checked here as far as one rank can; that they form a permutation is the
// backend's to find (the thread backend sees every rank's call; mpi and nccl hang until the
// deadline). The fingerprint leaves them out (root stays -1), so ranks agree on kind, count
// and dtype only.
Work Communicator::sendrecv(const Tensor& input, const Tensor& output, int send_to, int recv_from,
                            const CallOptions& call) {
  CollectiveInfo info = make_info(CollectiveKind::sendrecv, ReduceOp::sum, output.dtype(), output.numel(), -1, call);
  info.send_to = send_to;
  info.recv_from = recv_from;
  TUTTI_CHECK_ARG(send_to >= 0 && send_to < size_, "sendrecv: send_to ", send_to, " is not a rank of a world of ",
                  size_);
  TUTTI_CHECK_ARG(recv_from >= 0 && recv_from < size_, "sendrecv: recv_from ", recv_from,
                  " is not a rank of a world of ", size_);
  TUTTI_CHECK_ARG((send_to == rank_) == (recv_from == rank_), "sendrecv: rank ", rank_, " sends to rank ", send_to,
                  " but receives from rank ", recv_from,
                  " (a rank sends to itself exactly when it receives from itself)");
  check_tensor("input", input, info);
  check_tensor("output", output, info);
  TUTTI_CHECK_ARG(input.numel() == output.numel(), "sendrecv: input ", input.str(), " and output ", output.str(),
                  " differ in size");
  const char* in = static_cast<const char*>(input.data());
  const char* out = static_cast<const char*>(output.data());
  const bool overlapping = input.nbytes() > 0 && in < out + output.nbytes() && out < in + input.nbytes();
  TUTTI_CHECK_ARG(!overlapping, "sendrecv: input ", input.str(), " and output ", output.str(),
                  " overlap (they must be distinct buffers)");
  return issue(make_collective(std::move(info), input, output, call), &Communicator::do_sendrecv);
}

}  // namespace tutti
