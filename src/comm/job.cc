// Bootstrap: MPI, ranks, the device, the communicators; and the orderly teardown.
#include "tutti/comm/job.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/backend.h"
#include "comm/bootstrap_mpi.h"
#include "comm/control.h"
#include "comm/fault.h"
#include "comm/progress.h"
#include "comm/watchdog.h"
#include "core/gpu_runtime.h"
#include "tutti/kernels/threads.h"
#include "tutti/version.h"

namespace tutti {
namespace {

std::atomic<bool> job_alive{false};

// ---- stop signals: the handler only records the signal ----
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2};
std::atomic<int> stop_signal_received{0};
constexpr double kFinalizeAfterStop_s = 3.0;
extern "C" void on_stop_signal(int sig) {
  if (detail::job_failing.load(std::memory_order_relaxed)) {
    // The job is ending anyway: this is the launcher ending it. Act as by default.
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  stop_signal_received.store(sig, std::memory_order_relaxed);
}

// ---- an exception escaping main ----
std::terminate_handler previous_terminate = nullptr;
void on_terminate() {
  detail::Watchdog* w = detail::Watchdog::current();
  if (w != nullptr && w->channel_up()) {
    std::string what = "an exception of unknown type";
    if (std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        what = x.what();
      } catch (...) {
      }
    }
    w->end_job("an exception escaped (std::terminate): " + what, detail::kExitUncaught);
  }
  if (previous_terminate != nullptr) previous_terminate();
  std::abort();
}

// True on every rank when `ok` is true on every rank.
bool all_ranks(Bootstrap& boot, bool ok) {
  for (const std::string& v : boot.allgather(ok ? "1" : "0")) {
    if (v != "1") return false;
  }
  return true;
}

// Runs a local step of the bootstrap on every rank, then agrees: if it failed anywhere, every
// rank throws (the failing ones their own error), so that no rank is left waiting in the next
// collective step.
template <typename F>
void agreed(Bootstrap& boot, const char* step, F&& f) {
  std::exception_ptr error;
  try {
    f();
  } catch (...) {
    error = std::current_exception();
  }
  if (all_ranks(boot, error == nullptr)) return;
  if (error) std::rethrow_exception(error);
  TUTTI_THROW(Error, "job setup failed on another rank while ", step, " (see that rank's error)");
}

// A launcher that starts this job before the one it replaces has stopped (tutti-launch growing
// onto a host that is back: docs/launcher.md) names a file in TUTTI_START_GATE: rank 0 writes
// <gate>.ready once every rank is here, and every rank waits until the gate exists. Where:
// at the end of the Job's set-up (MPI, the device, the communicators), or with
// TUTTI_START_GATE_AT=run in train::Run, once the program has built its model and loaded its
// data, before it reads the checkpoint (Job::pass_start_gate).
void wait_at_start_gate(Bootstrap& boot, const std::string& gate) {
  all_ranks(boot, true);  // every rank is here
  if (boot.rank() == 0) std::ofstream(gate + ".ready") << "ready\n";
  while (!std::filesystem::exists(gate)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

std::string start_gate() {
  const char* gate = std::getenv("TUTTI_START_GATE");
  return gate ? gate : "";
}

bool start_gate_in_run() {
  const char* at = std::getenv("TUTTI_START_GATE_AT");
  return at != nullptr && std::string_view(at) == "run";
}

Device choose_device(const std::string& wanted, int local_rank) {
  const int gpus = cuda_device_count();
  if (wanted == "auto") return gpus > 0 ? Device::cuda(local_rank % gpus) : Device::cpu();
  if (wanted == "cpu") return Device::cpu();
  if (wanted == "cuda") {
    TUTTI_CHECK_ARG(gpus > 0, "JobOptions::device is 'cuda' but this process sees no GPU (built with CUDA: ",
                    built_with_cuda() ? "yes" : "no", ")");
    return Device::cuda(local_rank % gpus);
  }
  const Device d = Device::parse(wanted);
  d.require_available();
  return d;
}

// JobOptions::mpi_allreduce -> Open MPI's MCA variables (set unless the environment has them).
// coll/tuned numbers its allreduce algorithms: 1 basic linear, 2 nonoverlapping (reduce +
// bcast), 3 recursive doubling, 4 ring, 5 segmented ring, 6 rabenseifner.
std::string apply_mpi_allreduce(std::string wanted, bool will_init_mpi) {
  if (wanted.empty()) {
    const char* env = std::getenv("TUTTI_MPI_ALLREDUCE");
    wanted = env != nullptr && *env != '\0' ? env : "default";
  }
  static const std::pair<const char*, const char*> tuned[] = {{"reduce_bcast", "2"},
                                                              {"recursive_doubling", "3"},
                                                              {"ring", "4"},
                                                              {"segmented_ring", "5"},
                                                              {"rabenseifner", "6"}};
  const char* number = nullptr;
  for (const auto& [name, n] : tuned) {
    if (wanted == name) number = n;
  }
  TUTTI_CHECK_ARG(number != nullptr || wanted == "default" || wanted == "han",
                  "JobOptions::mpi_allreduce (or TUTTI_MPI_ALLREDUCE) must be default, ring, segmented_ring, "
                  "recursive_doubling, rabenseifner, reduce_bcast or han, got '",
                  wanted, "'");
  if (wanted == "default") return wanted;
  TUTTI_CHECK_ARG(will_init_mpi, "JobOptions::mpi_allreduce = '", wanted,
                  "' needs the Job to initialize MPI (the "
                  "program did: set Open MPI's coll_tuned/coll_han MCA variables before MPI_Init instead)");
  if (number != nullptr) {
    setenv("OMPI_MCA_coll_tuned_use_dynamic_rules", "1", /*overwrite=*/0);
    setenv("OMPI_MCA_coll_tuned_allreduce_algorithm", number, 0);
  } else {
    // han is built but off (priority 0) in Open MPI 4.1; above tuned's 30 it takes the
    // collectives it implements (allreduce among them) on every communicator.
    setenv("OMPI_MCA_coll_han_priority", "100", 0);
  }
  return wanted;
}

// Every rank waits in MPI_Finalize for all the others; a rank that never comes ends the job
// after the deadline instead of hanging it. After a stop signal the launcher may be taking
// the job down (mpirun and Slurm answer SIGTERM so) and then never completes MPI_Finalize:
// the program has stopped cleanly, so leave after a few seconds.
void finalize_now(detail::Watchdog& watchdog, detail::ProgressBoard* board, double timeout_s,
                  const char* when = "") noexcept {
  if (board) board->set_phase(detail::Phase::finalizing);
  {
    auto region =
        stop_signal_received.load() == 0
            ? watchdog.region(std::string("MPI_Finalize") + when + " (every rank waits there for all the others)",
                              timeout_s, detail::Phase::finalizing)
            : watchdog.quiet_region("MPI_Finalize after a stop signal", kFinalizeAfterStop_s,
                                    "MPI_Finalize did not return within 3 s of a clean stop (the "
                                    "launcher that sent the signal is ending the job); leaving without it.",
                                    0);
    detail::MpiWorld::finalize();
  }
  if (board) board->set_phase(detail::Phase::finished);
}

// finalize_now when the process exits (after main's catch blocks and their output), with the
// Job's watchdog kept alive until then for the deadline. One Job at a time: at most one waits.
void finalize_at_exit(std::shared_ptr<detail::Watchdog> watchdog, std::shared_ptr<detail::ProgressBoard> board,
                      double timeout_s) noexcept {
  struct Pending {
    std::shared_ptr<detail::Watchdog> watchdog;
    std::shared_ptr<detail::ProgressBoard> board;
    double timeout_s = 0;
  };
  static Pending* pending = nullptr;  // leaked on purpose: the handler runs during exit
  static std::once_flag registered;
  if (pending == nullptr) pending = new Pending;
  *pending = Pending{std::move(watchdog), std::move(board), timeout_s};
  std::call_once(registered, [] {
    std::atexit([] {
      if (!pending->watchdog || detail::MpiWorld::finalized()) return;
      // Whatever a killed process would lose: the job may end as soon as every rank is past this.
      std::fflush(nullptr);
      finalize_now(*pending->watchdog, pending->board.get(), pending->timeout_s, " at the process's exit");
      pending->watchdog.reset();
      pending->board.reset();
    });
  });
}

}  // namespace

struct Job::Impl {
  bool initialized_mpi = false;
  int uncaught_at_start = 0;  // std::uncaught_exceptions() when the Job was made
  double timeout_s = 300;     // the deadline of start-up, check_same, summary, finalize
  std::unique_ptr<detail::Watchdog> watchdog;
  std::shared_ptr<detail::ProgressBoard> board;
  int next_board_comm = 0;
  bool set_terminate_handler = false;
  std::unique_ptr<detail::MpiWorld> mpi;  // the Job's communicators over MPI_COMM_WORLD
  Bootstrap* boot = nullptr;              // mpi->world()
  Bootstrap* local_boot = nullptr;        // mpi->local()
  int rank = 0, size = 1, local_rank = 0, local_size = 1, node_count = 1;
  std::string mpi_allreduce = "default";
  Device device;
  std::string hostname;
  std::string start_gate;                 // TUTTI_START_GATE_AT=run: the gate Job::pass_start_gate waits at ("": none)
  std::shared_ptr<detail::Backend> comm;  // for device
  std::shared_ptr<detail::Backend> cpu_comm;  // the same as comm when comm is mpi
  std::mutex extra_mutex;
  std::vector<std::weak_ptr<detail::Backend>> extra;
  bool owns_slot = false;

  ~Impl() { teardown(std::uncaught_exceptions() > uncaught_at_start); }

  // The stop signals' handlers stay (job.h: a late signal must not kill a rank that saved).
  void restore_handlers() noexcept {
    if (set_terminate_handler) {
      std::set_terminate(previous_terminate);
      set_terminate_handler = false;
    }
  }

  void teardown(bool unwinding) noexcept {
    restore_handlers();
    std::vector<std::shared_ptr<detail::Backend>> all;
    {
      std::lock_guard lock(extra_mutex);
      for (auto& w : extra) {
        if (auto b = w.lock()) all.push_back(std::move(b));
      }
      extra.clear();
    }
    if (comm) all.push_back(comm);
    if (cpu_comm && cpu_comm != comm) all.push_back(cpu_comm);
    const bool mpi_up = watchdog && watchdog->channel_up();
    // NCCL comms and streams before MPI: shutdown() frees them.
    bool clean = true;
    if (unwinding && size > 1 && mpi_up) {
      // Never wait on the other ranks: they may be waiting for this one. If they are all
      // leaving too (an error every rank raised), an orderly end is still possible.
      const bool all_leaving = watchdog->leave(1.0);
      for (auto& b : all) {
        if (all_leaving) {
          clean = b->shutdown(2.0) && clean;
        } else {
          b->abandon();
          clean = false;
        }
      }
    } else {
      for (auto& b : all) clean = b->shutdown(std::numeric_limits<double>::infinity()) && clean;
    }
    all.clear();
    comm.reset();
    cpu_comm.reset();
    const bool finalized = detail::MpiWorld::finalized();
    boot = local_boot = nullptr;
    if (mpi_up && !finalized && clean) {
      watchdog->detach();
      if (mpi) mpi->release(/*free=*/true);
      if (initialized_mpi && unwinding) {
        // An error every rank raised: the program's catch blocks are still to run (each prints
        // its error, rank 0 writes its summary). Finalizing now would let the first rank to
        // exit end the others (mpirun ends a job at its first non-zero exit status) before
        // theirs ran: MPI_Finalize waits for every rank's process to exit instead.
        if (board) board->set_phase(detail::Phase::left);
        finalize_at_exit(std::shared_ptr<detail::Watchdog>(std::move(watchdog)), board, timeout_s);
      } else if (initialized_mpi) {
        finalize_now(*watchdog, board.get(), timeout_s);
      }
    } else if (mpi_up && !finalized && unwinding && initialized_mpi) {
      // A rank stuck in MPI (or the other ranks, still waiting) would make MPI_Finalize hang.
      // The program's catch block runs and prints first; the process's exit ends the job.
      watchdog->left(1);
    }
    if (mpi) mpi->release(/*free=*/false);
    // A collective missed its deadline without aborting (broken): MPI cannot be finalized; the
    // program ends its processes itself (abort_on_timeout = false).
    if (watchdog) watchdog->detach(/*free_comm=*/false);
    watchdog.reset();
    board.reset();
    if (owns_slot) job_alive.store(false);
    owns_slot = false;
  }

  int take_board_comm() { return next_board_comm++; }

  // COLLECTIVE: a communicator over the ranks that pass the same `color`, ranked by `key`, of
  // communicator()'s backend, watched like the Job's own and shut down with them
  // (node_groups, mesh).
  std::shared_ptr<Communicator> split(int color, int key, const CommOptions& options) {
    std::shared_ptr<detail::Backend> group =
        mpi->make_split_backend(color, key, comm->backend() == "nccl", device, options, take_board_comm());
    std::lock_guard lock(extra_mutex);
    extra.push_back(group);
    return group;
  }
};

Job::Job(int& argc, char**& argv, JobOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& j = *impl_;
  TUTTI_CHECK(!job_alive.exchange(true), "a tutti::Job exists already in this process (one at a time)");
  j.owns_slot = true;
  j.uncaught_at_start = std::uncaught_exceptions();
  // Malformed environment variables fail here, on every rank alike, before MPI starts.
  j.timeout_s = options.comm.timeout_seconds();
  (void)options.comm.debug_enabled();

  // The watchdog first: the deadline covers MPI_Init too. Where the launcher says who is who,
  // this host's progress board exists from now on, so that a start-up report can say which
  // ranks of the host never arrived.
  j.watchdog = std::make_unique<detail::Watchdog>();
  if (auto early = detail::ProgressBoard::open_from_launcher()) {
    j.watchdog->set_rank(early->rank(), early->size());
    j.board = std::move(early);
    j.board->set_phase(detail::Phase::starting);
    j.watchdog->set_board(j.board);
  }
  detail::inject_fault(detail::FaultPoint::start);
  auto startup = j.watchdog->region("the job's start-up (MPI_Init: every rank waits there for all the others)",
                                    j.timeout_s, detail::Phase::mpi_init);

  const bool initialized = detail::MpiWorld::initialized();
  TUTTI_CHECK(!detail::MpiWorld::finalized(),
              "MPI was finalized already (by an earlier Job or the program); MPI cannot start twice");
  j.mpi_allreduce = apply_mpi_allreduce(options.mpi_allreduce, !initialized);
  int provided = 0;
  if (j.board) j.board->set_phase(detail::Phase::mpi_init);
  detail::inject_fault(detail::FaultPoint::init);  // in the start-up's deadline, before MPI_Init
  if (!initialized) {
    // Every rank runs a compute thread and a communication thread, so a host's cores are
    // shared even with one rank per core. Open MPI busy-polls inside blocking calls; told to
    // yield while it waits, a waiting rank gives its core to the thread or rank that the
    // collective is waiting for (measured on 2 cores: a step's exposed communication fell
    // from ~25 ms to ~3 ms under load). The user's own setting wins.
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
    provided = detail::MpiWorld::init_thread_multiple(argc, argv);
    j.initialized_mpi = true;
  } else {
    provided = detail::MpiWorld::query_thread();
  }
  // From here on the ranks hear from each other when one fails, and the control channel can
  // end the job (MPI_Abort).
  j.watchdog->attach(detail::MpiWorld::make_control());
  if (j.board) j.board->set_phase(detail::Phase::bootstrap);
  startup.set_what("the job's start-up (making its communicators)");
  TUTTI_CHECK(detail::MpiWorld::thread_multiple(provided),
              "tutti needs MPI_THREAD_MULTIPLE (its communication threads call MPI "
              "while other threads may), but MPI provides thread level ",
              provided,
              j.initialized_mpi ? " (this MPI library lacks it)"
                                : " (initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...))");

  j.mpi = std::make_unique<detail::MpiWorld>();
  j.boot = &j.mpi->world();
  j.local_boot = &j.mpi->local();
  j.rank = j.boot->rank();
  j.size = j.boot->size();
  set_error_rank(j.rank);
  ErrorContext context("setting up the job (rank " + std::to_string(j.rank) + " of " + std::to_string(j.size) + ")");
  j.local_rank = j.local_boot->rank();
  j.local_size = j.local_boot->size();
  j.board = detail::ProgressBoard::open_after_init(j.board, *j.local_boot, j.rank, j.size);
  j.watchdog->set_board(j.board);
  if (options.cpu_threads > 0) {
    kernels::set_cpu_threads(options.cpu_threads);
  } else if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr && std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    kernels::set_cpu_threads(std::max(1, cores / std::max(1, j.local_size)));
  }
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
  j.hostname = host;
  // One leader (local rank 0) per shared-memory node; and every rank's host for the reports.
  j.node_count = 0;
  for (const std::string& leader : j.boot->allgather(j.local_rank == 0 ? "1" : "0")) j.node_count += leader == "1";
  j.watchdog->set_hosts(j.boot->allgather(j.hostname));

  agreed(*j.boot, "choosing the device", [&] {
    TUTTI_CHECK_ARG(options.backend == "auto" || options.backend == "mpi" || options.backend == "nccl",
                    "JobOptions::backend must be 'auto', 'mpi' or 'nccl', got '", options.backend, "'");
    j.device = choose_device(options.device, j.local_rank);
    if (j.device.is_cuda()) gpu::set_device(j.device.index);
  });

  // NCCL wants one GPU per rank: two ranks of a node on one GPU use mpi instead.
  std::vector<std::string> devices = j.local_boot->allgather(j.device.str());
  const bool gpu_to_itself =
      j.device.is_cuda() && std::set<std::string>(devices.begin(), devices.end()).size() == devices.size();
  const bool nccl_everywhere = all_ranks(*j.boot, gpu_to_itself && detail::built_with_nccl());
  bool use_nccl = false;
  agreed(*j.boot, "choosing the backend", [&] {
    if (options.backend == "nccl") {
      TUTTI_CHECK_ARG(detail::built_with_nccl(), "JobOptions::backend is 'nccl' but tutti was built without NCCL");
      TUTTI_CHECK_ARG(nccl_everywhere,
                      "JobOptions::backend is 'nccl' but not every rank has a GPU of its own (this "
                      "rank: ",
                      j.device.str(), ", ", j.local_size, " rank(s) on host ", j.hostname, ")");
    }
    use_nccl = options.backend == "nccl" || (options.backend == "auto" && nccl_everywhere);
  });

  if (use_nccl) {
    startup.set_what("the job's start-up (creating the NCCL communicator: every rank waits for all the others)");
    j.comm = detail::make_nccl_backend(*j.boot, j.mpi->control(), j.device, options.comm, j.take_board_comm());
    j.cpu_comm = j.mpi->make_mpi_backend(Device::cpu(), options.comm, j.take_board_comm());
  } else {
    j.comm = j.mpi->make_mpi_backend(j.device, options.comm, j.take_board_comm());
    j.cpu_comm = j.comm;
  }

  if (options.catch_stop_signals) {
    for (std::size_t i = 0; i < std::size(kStopSignals); ++i) {
      struct sigaction action {};
      action.sa_handler = on_stop_signal;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART | SA_RESETHAND;  // a second signal acts as by default
      sigaction(kStopSignals[i], &action, nullptr);
    }
  }
  previous_terminate = std::set_terminate(on_terminate);
  j.set_terminate_handler = true;
  if (const std::string gate = start_gate(); !gate.empty() && start_gate_in_run()) {
    j.start_gate = gate;  // train::Run passes it (Job::pass_start_gate)
  } else if (!gate.empty()) {
    startup.set_what("the job's start-up (waiting at the launcher's start gate " + gate + ")");
    wait_at_start_gate(*j.boot, gate);
  }
  if (j.board) j.board->set_phase(detail::Phase::running);
  detail::inject_fault(detail::FaultPoint::ready);
}

Job::~Job() = default;
Job::Job(Job&&) noexcept = default;
Job& Job::operator=(Job&&) noexcept = default;

void Job::pass_start_gate() {
  Impl& j = *impl_;
  if (j.start_gate.empty()) return;
  auto region = j.watchdog->region("waiting at the launcher's start gate " + j.start_gate + " (every rank waits there)",
                                   j.timeout_s);
  wait_at_start_gate(*j.boot, j.start_gate);
  j.start_gate.clear();
}

int Job::rank() const { return impl_->rank; }
int Job::world_size() const { return impl_->size; }
int Job::local_rank() const { return impl_->local_rank; }
int Job::local_size() const { return impl_->local_size; }
int Job::node_count() const { return impl_->node_count; }
const std::string& Job::mpi_allreduce() const { return impl_->mpi_allreduce; }
Device Job::device() const { return impl_->device; }
const std::string& Job::hostname() const { return impl_->hostname; }
std::string_view Job::backend() const { return impl_->comm->backend(); }
Communicator& Job::communicator() { return *impl_->comm; }
Communicator& Job::cpu_communicator() { return *impl_->cpu_comm; }

std::string Job::mpi_version() const { return detail::MpiWorld::version(); }

std::string Job::nccl_version() const { return detail::nccl_version(); }

std::shared_ptr<Communicator> Job::new_communicator(CommOptions options, std::string_view backend) {
  Impl& j = *impl_;
  TUTTI_CHECK_ARG(backend == "auto" || backend == "mpi" || backend == "nccl",
                  "Job::new_communicator: backend must be 'auto', 'mpi' or 'nccl', got '", std::string(backend), "'");
  const bool nccl = backend == "nccl" || (backend == "auto" && j.comm->backend() == "nccl");
  auto region = j.watchdog->region("Job::new_communicator (every rank waits there for all the others)", j.timeout_s);
  const int slot = j.take_board_comm();
  std::shared_ptr<detail::Backend> b =
      nccl ? detail::make_nccl_backend(*j.boot, j.mpi->control(), j.device, std::move(options), slot)
           : j.mpi->make_mpi_backend(j.device, std::move(options), slot);
  std::lock_guard lock(j.extra_mutex);
  j.extra.push_back(b);
  return b;
}

NodeGroups Job::node_groups(CommOptions options, int ranks_per_node) {
  Impl& j = *impl_;
  TUTTI_CHECK_ARG(ranks_per_node >= 0, "Job::node_groups: ranks_per_node must be >= 0, got ", ranks_per_node);
  auto region = j.watchdog->region("Job::node_groups (every rank waits there for all the others)", j.timeout_s);
  NodeGroups g;
  int local = j.local_rank;
  if (ranks_per_node > 0) {
    g.node = j.rank / ranks_per_node;
    local = j.rank % ranks_per_node;
    for (int r = 0; r < j.size; r += ranks_per_node) g.node_sizes.push_back(std::min(ranks_per_node, j.size - r));
  } else {
    // Each rank's node is named by its lowest rank (local rank 0's); nodes numbered in rank order.
    const std::vector<std::string> leaders = j.boot->allgather(j.local_boot->broadcast(std::to_string(j.rank), 0));
    std::vector<std::string> seen;
    for (int r = 0; r < j.size; ++r) {
      const std::string& leader = leaders[static_cast<std::size_t>(r)];
      auto it = std::find(seen.begin(), seen.end(), leader);
      if (it == seen.end()) {
        seen.push_back(leader);
        g.node_sizes.push_back(0);
        it = seen.end() - 1;
      }
      ++g.node_sizes[static_cast<std::size_t>(it - seen.begin())];
      if (r == j.rank) g.node = static_cast<int>(it - seen.begin());
    }
  }
  g.intra = j.split(g.node, local, options);
  g.inter = j.split(local, g.node, options);
  return g;
}

DeviceMesh Job::mesh(std::vector<MeshDim> dims, CommOptions options) {
  Impl& j = *impl_;
  std::string spelled;
  for (const MeshDim& d : dims) spelled += (spelled.empty() ? "" : " x ") + d.name + " " + std::to_string(d.size);
  check_same("Job::mesh's dimensions", spelled);
  dims = DeviceMesh::resolve(std::move(dims), j.size);
  auto region = j.watchdog->region("Job::mesh (every rank waits there for all the others)", j.timeout_s);
  const std::vector<int> at = DeviceMesh::coordinates(dims, j.rank);
  std::vector<std::shared_ptr<Communicator>> groups;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    groups.push_back(j.split(DeviceMesh::color(dims, j.rank, static_cast<int>(d)), at[d], options));
  }
  return DeviceMesh(std::move(dims), j.rank, std::move(groups));
}

std::string Job::summary() const {
  const Impl& j = *impl_;
  auto region = j.watchdog->region("Job::summary (every rank waits there for all the others)", j.timeout_s);
  char line[512];
  std::snprintf(line, sizeof line, "  rank %d/%d  host %s  local %d/%d  device %s [%s]  backend %s\n", j.rank, j.size,
                j.hostname.c_str(), j.local_rank, j.local_size, j.device.str().c_str(),
                device_description(j.device).c_str(), std::string(j.comm->backend()).c_str());
  const std::vector<std::string> lines = j.boot->allgather(line);
  std::string out = "tutti " + std::string(version()) + ": " + std::to_string(j.size) + " rank(s) on " +
                    std::to_string(j.node_count) + " host(s), backend " + std::string(j.comm->backend()) +
                    (j.mpi_allreduce == "default" ? "" : ", MPI allreduce " + j.mpi_allreduce) + "\n";
  const kernels::CpuBlasInfo blas = kernels::cpu_blas_info();
  out += "  " + mpi_version() + "; NCCL " + nccl_version() + "; CUDA runtime " + cuda_runtime_version() + ", driver " +
         cuda_driver_version() + "; OpenBLAS " + blas.core + " kernels on " + blas.cpu_isa + "; CPU conv " + blas.conv +
         "\n";
  if (!blas.suggested.empty()) out += "  warning: " + blas.warning() + "\n";
  for (const auto& l : lines) out += l;
  return out;
}

void Job::check_same(std::string_view what, std::string_view value) {
  Impl& j = *impl_;
  std::vector<std::string> all;
  {
    auto region = j.watchdog->region(
        "Job::check_same(\"" + std::string(what) + "\") (every rank waits there for all the others)", j.timeout_s);
    all = j.boot->allgather(value);
  }
  // Distinct values in the order of the first rank that has each.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == all[static_cast<std::size_t>(r)]; });
    if (it == groups.end()) {
      groups.push_back({all[static_cast<std::size_t>(r)], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  if (groups.size() <= 1) return;
  std::string text;
  for (const auto& [v, ranks] : groups) {
    if (!text.empty()) text += "; ";
    text += "'" + (v.size() > 200 ? v.substr(0, 200) + "..." : v) + "' on rank" + (ranks.size() > 1 ? "s" : "");
    for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : " ") + std::to_string(ranks[i]);
  }
  TUTTI_THROW(InvalidArgument, "ranks disagree on ", what, ": ", text, " (every rank must have the same value)");
}

void Job::check_same(std::string_view what, std::int64_t value) { check_same(what, std::to_string(value)); }

bool Job::stop_requested() const { return stop_signal_received.load(std::memory_order_relaxed) != 0; }
int Job::stop_signal() const { return stop_signal_received.load(std::memory_order_relaxed); }

Job::StopAgreement Job::agree_stop() {
  // One integer per rank: rank · 256 + signal where a signal came (signals are < 256), else the
  // largest i64; the minimum names the lowest signalled rank and its signal.
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  const int sig = stop_signal();
  const Tensor vote = Tensor::from_ints({sig != 0 ? std::int64_t{rank()} * 256 + sig : kNone}, {1}, DType::i64);
  CallOptions call;
  call.label = "agree_stop";
  cpu_communicator().allreduce(vote, ReduceOp::min, call).wait();
  const std::int64_t agreed = vote.to_ints()[0];
  if (agreed == kNone) return {};
  return {true, static_cast<int>(agreed % 256), static_cast<int>(agreed / 256)};
}

void Job::abort(std::string_view reason, int exit_code) {
  impl_->watchdog->end_job("aborting the job: " + std::string(reason), exit_code);
  std::_Exit(exit_code);  // the process's watchdog does not return; [[noreturn]] says so
}

Job init(int& argc, char**& argv, JobOptions options) { return Job(argc, argv, std::move(options)); }

}  // namespace tutti
