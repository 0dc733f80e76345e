// train::Run: the step protocol (next, add_loss, end_step) and the ending (finish).
// Resume and the checkpoint writer are in checkpointing.cc.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "train/run_impl.h"
#include "tutti/amp/loss_scaler.h"
#include "tutti/comm/job.h"
#include "tutti/core/error.h"
#include "tutti/core/trace.h"
#include "tutti/ddp/ddp.h"
#include "tutti/kernels/elementwise.h"
#include "tutti/kernels/fixed_point.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/optimizer.h"

namespace tutti::train {
namespace {

using Phase = Run::Impl::Phase;

const char* signal_name(int sig) {
  switch (sig) {
    case 0: return "a stop request";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case kPreemptionNotice: return "a preemption notice";
  }
  return "a signal";
}

// check_same without a Job: the crc32 of the value, its minimum and maximum over the ranks.
void check_same_over(Communicator& comm, int rank, std::string_view what, std::string_view value) {
  const std::int64_t crc = crc_of(value);
  const Tensor vote = Tensor::from_ints({crc, -crc}, {2}, DType::i64);
  CallOptions call;
  call.label = "train::Run check_same";
  comm.allreduce(vote, ReduceOp::min, call).wait();
  const std::vector<std::int64_t> v = vote.to_ints();
  TUTTI_CHECK_ARG(v[0] == -v[1], "ranks disagree on ", what, ": '", value, "' on rank ", rank,
                  " differs from another rank's (every rank must have the same value)");
}

std::string describe(const RunOptions& o) {
  std::ostringstream s;
  s << "steps " << o.steps << ", checkpoint dir '" << o.checkpoint_dir << "', checkpoint every " << o.checkpoint_every
    << ", resume " << static_cast<int>(o.resume) << (o.overwrite ? ", overwrite" : "") << ", precision '" << o.precision
    << "', checkpoint mode " << static_cast<int>(o.checkpoint_mode) << ", busy " << static_cast<int>(o.checkpoint_busy)
    << ", snapshot every " << o.snapshots.every << " (cost " << o.snapshots.cost << ", MTBF " << o.snapshots.mtbf
    << " s) in '" << o.snapshots.dir << "', " << o.work_per_step << " " << o.work_unit << " per step at "
    << o.price_per_hour << " per rank-hour, preemption notices from '" << o.preemption.source << "' every "
    << o.preemption.poll_seconds << " s";
  return s.str();
}

}  // namespace

Resume parse_resume(std::string_view text) {
  if (text == "no") return Resume::no;
  if (text == "yes") return Resume::yes;
  if (text == "auto") return Resume::automatic;
  TUTTI_THROW(InvalidArgument, "resume: '", text, "' is none of no, yes, auto");
}

State::State(ddp::DistributedDataParallel& d, optim::Optimizer& o, amp::LossScaler& s)
    : ddp(&d), optimizer(&o), scaler(&s) {
  // The communication hook's state (PowerSGD's error feedback and Q): an entry like any other.
  if (ddp::CommHook* hook = d.reducer().comm_hook()) {
    add(Entry{hook->name() + ".", [hook, &d] { return hook->state_dict(d.module().stream()); },
              [hook, &d](const StateDict& saved) { return hook->load_state_dict(saved, d.module().stream()); },
              hook->collective_state(), hook->not_in_snapshots()});
  }
}

State& State::add(Entry entry) {
  entries.push_back(std::move(entry));
  return *this;
}

State& State::add(const std::string& prefix, std::function<StateDict()> save,
                  std::function<void(const StateDict&)> load) {
  return add(Entry{prefix, std::move(save),
                   [load = std::move(load)](const StateDict& saved) {
                     load(saved);
                     return std::string();
                   },
                   false, ""});
}

State& State::add_scalar(const std::string& name, double& value) {
  // An entry whose prefix is the whole name: its one tensor is "" under it.
  return add(
      name,
      [&value] {
        return StateDict{{"", scalar_tensor(value)}};
      },
      [&value](const StateDict& s) {
        if (s.count("")) value = get_scalar(s, "");
      });
}

Run::Run(Job& job, State state, RunOptions options)
    : impl_(std::make_unique<Impl>(std::move(state), std::move(options))) {
  Impl& m = *impl_;
  m.comm = &job.communicator();
  m.cpu_comm = &job.cpu_communicator();
  m.rank = job.rank();
  m.world = job.world_size();
  m.check_same = [&job](std::string_view what, std::string_view value) { job.check_same(what, value); };
  m.signal = [&job] { return job.stop_signal(); };
  m.hostname = job.hostname();
  m.pass_start_gate = [&job] { job.pass_start_gate(); };
  // A Job is one a process: the attempt started with the process (its start-up is its cost too).
  m.attempt_started_unix = process_started_unix();
  m.start();
}

Run::Run(Communicator& comm, State state, RunOptions options, detail::RunHooks hooks)
    : impl_(std::make_unique<Impl>(std::move(state), std::move(options), std::move(hooks))) {
  Impl& m = *impl_;
  m.comm = &comm;
  m.cpu_comm = &comm;
  m.rank = comm.rank();
  m.world = comm.size();
  m.check_same = [&m](std::string_view what, std::string_view value) {
    check_same_over(*m.cpu_comm, m.rank, what, value);
  };
  m.signal = [] { return 0; };
  m.start();
}

Run::~Run() {
  if (impl_) impl_->write_failed_status();
}

void Run::Impl::start() {
  if (attempt_started_unix == 0) attempt_started_unix = unix_now();
  // A launcher's say (tutti-launch sets it): the same on every rank, as the options' check below sees.
  if (const char* env = std::getenv("TUTTI_RESUME"); env && *env) {
    try {
      options.resume = parse_resume(env);
    } catch (const InvalidArgument&) {
      TUTTI_THROW(InvalidArgument, "train::Run: $TUTTI_RESUME is '", env, "', none of no, yes, auto");
    }
  }
  TUTTI_CHECK_ARG(options.steps > 0, "train::Run: RunOptions::steps must be positive, got ", options.steps);
  TUTTI_CHECK_ARG(options.checkpoint_every >= 0, "train::Run: RunOptions::checkpoint_every must be >= 0, got ",
                  options.checkpoint_every);
  TUTTI_CHECK_ARG(options.resume == Resume::no || !options.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  // A summary that could not be written at the end would lose the run's result: fail now.
  if (options.summary) options.summary->set_rank(rank);
  TUTTI_CHECK_ARG(options.checkpoint_busy == io::WhenBusy::wait || options.checkpoint_mode == io::CheckpointMode::async,
                  "train::Run: RunOptions::checkpoint_busy skip needs checkpoint_mode async (--checkpoint-busy skip "
                  "needs --checkpoint-mode async)");
  TUTTI_CHECK_ARG(options.snapshots.every >= 0 || options.snapshots.every == kSnapshotAuto,
                  "train::Run: RunOptions::snapshots.every must be >= 0 or kSnapshotAuto, got ",
                  options.snapshots.every);
  TUTTI_CHECK_ARG(options.snapshots.cost > 0 && options.snapshots.cost < 1,
                  "train::Run: RunOptions::snapshots.cost must be in (0, 1), got ", options.snapshots.cost);
  TUTTI_CHECK_ARG(options.snapshots.mtbf >= 0 && options.work_per_step >= 0 && options.price_per_hour >= 0,
                  "train::Run: RunOptions::snapshots.mtbf, work_per_step and price_per_hour must be >= 0 (--mtbf ",
                  options.snapshots.mtbf, ", --price-per-hour ", options.price_per_hour, ")");
  TUTTI_CHECK_ARG(options.snapshots.every == 0 || !options.checkpoint_dir.empty(),
                  "--snapshot-every needs --checkpoint-dir (the run id, and the file the snapshots fall back on)");
  TUTTI_CHECK_ARG(options.snapshots.nodes.empty() || static_cast<int>(options.snapshots.nodes.size()) == world,
                  "train::Run: RunOptions::snapshots.nodes names ", options.snapshots.nodes.size(), " nodes for ",
                  world, " ranks");
  const bool collective = std::any_of(state.entries.begin(), state.entries.end(),
                                      [](const State::Entry& e) { return e.collective && e.not_in_snapshots.empty(); });
  TUTTI_CHECK_ARG(options.snapshots.every == 0 || !collective,
                  "--snapshot-every: memory snapshots cannot hold a collective state entry (State::add_collective, "
                  "e.g. --sync diloco): use checkpoint files");
  check_same("the run's options (train::RunOptions)", describe(options));
  if (pass_start_gate) pass_start_gate();  // a job started ahead by tutti-launch: the old one has stopped
  path = options.checkpoint_dir.empty() ? "" : options.checkpoint_dir + "/checkpoint.tckp";
  if (options.snapshots.every != 0) nodes = snapshot_nodes();
  snapshot_every = std::max<std::int64_t>(options.snapshots.every, 0);
  resume_from_checkpoint();
  if (snapshots) start_snapshots();
  first_step = step;
  if (rank == 0 && !path.empty()) {
    writer = std::make_unique<io::CheckpointWriter>(io::CheckpointWriterOptions{
        .mode = options.checkpoint_mode, .when_busy = options.checkpoint_busy, .hooks = hooks.checkpoint});
  }
  // The module's device, not its first parameter's: under ZeRO-3 a parameter may be released.
  const Device device = state.ddp->module().device();
  one = Tensor::from_floats({1.0f}, {1}).to(device, options.stream);
  sync = Tensor::zeros({2}, DType::f32, device);
  if (state.ddp->options().deterministic) exact_loss = Tensor::zeros({3}, DType::i64, device);
  if (!options.preemption.source.empty())
    watcher = std::make_unique<PreemptionWatcher>(options.preemption, host_name());
  start_status();
  if (options.summary) {
    options.summary->set("resumed_from_step", resumed ? first_step : std::int64_t{0});
    if (resumed) options.summary->set("resumed_from", from_memory ? "memory" : "checkpoint file");
    if (resumed) options.summary->set("resume_note", note);  // Run::note(): what did not continue exactly
    options.summary->set_step(step, loss);
  }
}

bool Run::next() {
  Impl& m = *impl_;
  TUTTI_CHECK(m.phase != Phase::in_step, "train::Run::next: the step before has not ended (end_step())");
  if (m.phase != Phase::between) return false;
  if (m.step >= m.options.steps) {
    m.phase = Phase::completed;
    return false;
  }
  m.phase = Phase::in_step;
  m.loss_added = false;
  trace::begin_step(m.step + 1);
  m.step_began = std::chrono::steady_clock::now();
  m.sync.zero(m.options.stream);
  if (m.exact_loss.defined()) m.exact_loss.zero(m.options.stream);
  return true;
}

void Run::add_loss(const Tensor& loss, float weight) {
  Impl& m = *impl_;
  TUTTI_CHECK(m.phase == Phase::in_step, "train::Run::add_loss: outside a step (call next() first)");
  m.loss_added = true;
  if (m.exact_loss.defined()) {
    TUTTI_CHECK_ARG(weight > 0, "train::Run::add_loss: the deterministic mode needs a positive weight, got ", weight);
    // weight x k (k accumulation steps; the sum is divided by k x ranks in end_step), rounded
    // to 16 significant bits: a program's 1/k (rounded to a float) then weighs exactly 1 for
    // every k, so the sum does not depend on how the slices are split into ranks and steps.
    int e = 0;
    const double f = std::frexp(static_cast<double>(weight) * m.state.ddp->options().accumulation_steps, &e);
    const double w = std::ldexp(std::nearbyint(std::ldexp(f, 16)), e - 16);
    // At most 2^46 units (|w x loss| <= 2^14) per add, so that 2^16 adds cannot overflow.
    kernels::fixed_point_accumulate(loss, std::ldexp(w, 32), std::ldexp(1.0, 46), m.exact_loss.view(0, {1}),
                                    m.exact_loss.view(1, {2}), /*zero_x=*/false, m.options.stream);
    return;
  }
  kernels::add_scaled(loss, weight, m.sync.view(0, {1}), m.options.stream);
}

Tensor Run::sync_slots(int count) {
  Impl& m = *impl_;
  TUTTI_CHECK(m.phase == Phase::in_step, "train::Run::sync_slots: outside a step (call next() first)");
  TUTTI_CHECK(!m.loss_added, "train::Run::sync_slots: call it before add_loss() in a step");
  TUTTI_CHECK_ARG(count >= 0, "train::Run::sync_slots: count must be >= 0, got ", count);
  if (m.sync.numel() != 2 + count) {
    m.sync = Tensor::zeros({2 + count}, DType::f32, m.sync.device());
    m.sync.zero(m.options.stream);
  }
  return count > 0 ? m.sync.view(2, {count}) : Tensor();
}

void Run::request_stop(int signal) { impl_->requested_signal = signal; }

const StepEnd& Run::end_step() {
  Impl& m = *impl_;
  TUTTI_CHECK(m.phase == Phase::in_step, "train::Run::end_step: outside a step (call next() first)");
  m.check_background_work();
  const Stream& stream = m.options.stream;
  // The mean loss over the whole global batch (the mean of the ranks' equal-sized means), the
  // stop flag (> 0 when any rank has one) and the program's figures: the step's one collective.
  const Tensor stop_flag = m.sync.view(1, {1});
  // A rank with a preemption notice adds world + 1, one with a signal or a request 1: the mean
  // is above 1 exactly when some rank has a notice, which every rank then knows.
  if (m.stop_requested()) {
    kernels::add_scaled(m.one, m.noticed() ? static_cast<float>(m.world + 1) : 1.0f, stop_flag, stream);
  }
  CallOptions call;
  call.label = "train loss and stop flag";
  call.stream = stream;
  m.comm->allreduce(m.sync, ReduceOp::avg, call).wait(stream);
  m.loss = nn::item(m.sync.view(0, {1}), stream);
  if (m.exact_loss.defined()) {
    call.label = "train loss (deterministic: int64)";
    m.comm->allreduce(m.exact_loss, ReduceOp::sum, call).wait(stream);
    const Tensor host = m.exact_loss.to(Device::cpu(), stream);
    stream.synchronize();
    const std::vector<std::int64_t> v = host.to_ints();
    m.loss = v[1] > 0   ? std::numeric_limits<double>::quiet_NaN()
             : v[2] > 0 ? std::numeric_limits<double>::infinity()
                        : static_cast<double>(static_cast<float>(
                              std::ldexp(static_cast<double>(v[0]), -32) /
                              (static_cast<double>(m.state.ddp->options().accumulation_steps) * m.world)));
  }
  const double stop_value = nn::item(stop_flag, stream);
  const bool stop = stop_value > 0;
  const bool notice = stop_value > 1 + 0.5 / m.world;
  ++m.step;
  m.note_step_time();
  if (m.options.summary) m.options.summary->set_step(m.step, m.loss);
  trace::end_step();

  m.end = StepEnd{};
  m.end.step = m.step;
  m.end.loss = m.loss;
  m.end.stop = stop;
  m.end.last = m.step >= m.options.steps;
  m.phase = Phase::between;
  // fp16's loss scaler skips non-finite steps (and throws at its floor); without it a
  // non-finite loss means the run diverged. Every rank sees the same mean loss, so every rank
  // stops here alike, with no checkpoint of this step.
  if (!std::isfinite(m.loss) && !m.state.scaler->enabled()) {
    m.end.diverged = true;
    m.phase = Phase::diverged;
    return m.end;
  }
  // A node is about to go: memory first (quick, and held by the survivors), then the file.
  if (notice && m.snapshots && !m.end.last) m.snapshot_this_step();
  if (!m.path.empty() &&
      ((m.options.checkpoint_every > 0 && m.step % m.options.checkpoint_every == 0) || m.end.last || stop)) {
    const auto t0 = std::chrono::steady_clock::now();
    m.write_checkpoint(m.end.last || stop);
    m.end.checkpoint = true;
    m.end.checkpoint_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (m.rank != 0) {  // rank 0 counts a checkpoint once its writer completed it
      m.saved_step = m.step;
      m.saved_loss = m.loss;
    }
  }
  m.maybe_snapshot(m.end.last, stop);
  if (m.end.last) {
    m.phase = Phase::completed;
  } else if (stop) {
    m.phase = Phase::stopped;
  }
  // The launcher's view: at most every 0.2 s, and at once for a checkpoint completed or a snapshot.
  m.write_status("running", m.saved_step != m.status_saved_step || m.end.snapshot || m.step == m.first_step + 1);
  return m.end;
}

std::vector<std::string> Run::Impl::gather_preempted_hosts() const {
  // Each rank's host name where it had a notice (else nothing), 64 bytes a rank, as i64s.
  constexpr int kBytes = 64;
  std::vector<std::int64_t> mine(kBytes, 0);
  if (noticed()) {
    const std::string name = host_name().substr(0, kBytes);
    for (std::size_t i = 0; i < name.size(); ++i) mine[i] = static_cast<unsigned char>(name[i]);
  }
  const Tensor all = Tensor::empty({std::int64_t{kBytes} * world}, DType::i64);
  CallOptions call;
  call.label = "preempted hosts";
  cpu_comm->allgather(Tensor::from_ints(mine, {kBytes}, DType::i64), all, call).wait();
  const std::vector<std::int64_t> v = all.to_ints();
  std::vector<std::string> hosts;
  for (int r = 0; r < world; ++r) {
    std::string name;
    for (int i = 0; i < kBytes && v[static_cast<std::size_t>(r * kBytes + i)] != 0; ++i) {
      name += static_cast<char>(v[static_cast<std::size_t>(r * kBytes + i)]);
    }
    if (!name.empty() && std::find(hosts.begin(), hosts.end(), name) == hosts.end()) hosts.push_back(name);
  }
  return hosts;
}

Outcome Run::finish() {
  Impl& m = *impl_;
  TUTTI_CHECK(m.phase == Phase::completed || m.phase == Phase::stopped || m.phase == Phase::diverged,
              "train::Run::finish: the run has not ended (call it once next() returned false, and once)");
  m.wait_background_work();
  if (m.options.summary) {
    const Accounting a = m.account();
    Summary& summary = *m.options.summary;
    summary.set("attempts", a.attempts);
    summary.set("wall_seconds", a.wall_seconds);
    summary.set("rank_hours", a.rank_hours);
    summary.set("useful_seconds", a.useful_seconds);
    summary.set("goodput", a.goodput);
    summary.set("lost_seconds", a.lost_seconds);
    if (m.options.price_per_hour > 0) {
      summary.set("price_per_hour", m.options.price_per_hour);
      summary.set("cost", a.cost);
      if (a.cost_per_million > 0) summary.set("cost_per_million_" + m.options.work_unit, a.cost_per_million);
    }
  }
  Outcome out;
  out.step = m.step;
  char text[2048];
  if (m.phase == Phase::stopped) {
    // Every rank leaves once the checkpoint is written: after a stop signal the Job waits only
    // briefly in MPI_Finalize (the launcher may be taking the job down).
    CallOptions barrier;
    barrier.label = "stopped: the checkpoint is written";
    m.comm->barrier(barrier).wait();
    // Which rank asked, and by what: one integer per rank, rank · 256 + signal where one asked
    // (signals are < 256), else the largest i64; the minimum names the lowest such rank.
    constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
    const Tensor vote =
        Tensor::from_ints({m.stop_requested() ? std::int64_t{m.rank} * 256 + m.stop_signal() : kNone}, {1}, DType::i64);
    CallOptions agree;
    agree.label = "agree_stop";
    m.cpu_comm->allreduce(vote, ReduceOp::min, agree).wait();
    const std::int64_t agreed = vote.to_ints()[0];
    out.signal = agreed == kNone ? 0 : static_cast<int>(agreed % 256);
    out.signal_rank = agreed == kNone ? -1 : static_cast<int>(agreed / 256);
    out.status = Outcome::Status::stopped;
    const char* why = signal_name(out.signal);
    if (out.signal == kPreemptionNotice) out.signal = 0;
    if (m.watcher) {
      m.preempted_hosts = m.gather_preempted_hosts();
      out.preempted_hosts = m.preempted_hosts;
    }
    if (m.options.summary) {
      if (!out.preempted_hosts.empty()) {
        std::string hosts = "[";
        for (const std::string& h : out.preempted_hosts) hosts += (hosts.size() > 1 ? ", " : "") + json_quote(h);
        m.options.summary->set_json("preempted_hosts", hosts + "]");
      }
      m.options.summary->stopped(why, m.path);
    }
    if (m.rank == 0) {
      out.exit_code = 75;
      const std::string how = m.path.empty()
                                  ? "No checkpoint was written (no --checkpoint-dir): the run cannot be resumed."
                                  : "Checkpoint written to " + m.path + ". " + m.options.resume_advice;
      std::string by = why;
      if (!out.preempted_hosts.empty()) {
        by += by == signal_name(kPreemptionNotice) ? " for" : "; a preemption notice for";
        for (std::size_t i = 0; i < out.preempted_hosts.size(); ++i) by += (i ? ", " : " ") + out.preempted_hosts[i];
      }
      std::snprintf(text, sizeof text, "stopped at step %lld of %lld by %s (on rank %d). %s",
                    static_cast<long long>(m.step), static_cast<long long>(m.options.steps), by.c_str(),
                    out.signal_rank, how.c_str());
      out.message = text;
    }
  } else if (m.phase == Phase::diverged) {
    out.status = Outcome::Status::diverged;
    if (m.options.summary) m.options.summary->diverged();
    if (m.rank == 0) {
      out.exit_code = 3;
      const double lr = m.state.optimizer ? m.state.optimizer->lr() : 0;
      char where[1024];
      if (m.saved_step >= 0) {
        std::snprintf(where, sizeof where,
                      "The last good checkpoint (written before the loss stopped being finite) is %s, at step %lld "
                      "with train loss %g: resume from it with a smaller learning rate (the last step's was %g), or "
                      "from an earlier one.",
                      m.path.c_str(), static_cast<long long>(m.saved_step), m.saved_loss, lr);
      } else {
        std::snprintf(where, sizeof where,
                      "No checkpoint was written (--checkpoint-dir with --checkpoint-every N keeps one); start again "
                      "with a smaller learning rate (the last step's was %g).",
                      lr);
      }
      const std::string precision = m.options.precision.empty() ? "" : " (" + m.options.precision + ")";
      std::snprintf(text, sizeof text, "error: the training loss is %g at step %lld%s: the run diverged. %s", m.loss,
                    static_cast<long long>(m.step), precision.c_str(), where);
      out.message = text;
    }
  } else {
    if (m.options.summary) m.options.summary->completed();
  }
  // The checkpoint file holds the end (or, diverged, the last good state): the run's memory is
  // free again.
  if (m.snapshots) m.snapshots->remove_folder();
  m.write_status(out.status == Outcome::Status::completed ? "completed"
                 : out.status == Outcome::Status::stopped ? "stopped"
                                                          : "diverged",
                 true, out.exit_code, out.message);
  m.phase = Phase::finished;
  return out;
}

std::int64_t Run::step() const { return impl_->step; }
std::int64_t Run::first_step() const { return impl_->first_step; }
bool Run::resumed() const { return impl_->resumed; }
std::int64_t Run::steps() const { return impl_->options.steps; }
double Run::loss() const { return impl_->loss; }
bool Run::completed() const { return impl_->phase == Phase::completed; }
const std::string& Run::checkpoint_path() const { return impl_->path; }
std::int64_t Run::checkpoint_written_step() const { return impl_->saved_step; }
const std::string& Run::note() const { return impl_->note; }
bool Run::resumed_from_memory() const { return impl_->from_memory; }
const std::string& Run::snapshot_dir() const { return impl_->snapshot_folder; }
std::uint64_t Run::snapshot_bytes_per_node() const { return impl_->snapshot_node_bytes; }

}  // namespace tutti::train
