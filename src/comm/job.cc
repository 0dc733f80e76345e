// Bootstrap: MPI, ranks, the device, the communicators; and the orderly teardown.
#include "tutti/comm/job.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "comm/backend.h"
#include "comm/bootstrap_mpi.h"
#include "comm/fault.h"
#include "comm/progress.h"
#include "comm/watchdog.h"
#include "core/gpu_runtime.h"
#include "core/mpi_check.h"
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
  if (w != nullptr && w->mpi_up()) {
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

// ---- a Job left by an exception: MPI_Abort when the process exits ----
void abort_at_exit(int status, void*) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, status != 0 ? status : 1);
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

}  // namespace

struct Job::Impl {
  bool initialized_mpi = false;
  int uncaught_at_start = 0;  // std::uncaught_exceptions() when the Job was made
  double timeout_s = 300;     // the deadline of start-up, check_same, summary, finalize
  std::unique_ptr<detail::Watchdog> watchdog;
  std::shared_ptr<detail::ProgressBoard> board;
  int next_board_comm = 0;
  bool set_terminate_handler = false;
  MPI_Comm world = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD for the bootstrap and summary
  MPI_Comm local = MPI_COMM_NULL;
  std::unique_ptr<detail::MpiBootstrap> boot;        // over world
  std::unique_ptr<detail::MpiBootstrap> local_boot;  // over local
  int rank = 0, size = 1, local_rank = 0, local_size = 1, node_count = 1;
  std::string mpi_allreduce = "default";
  Device device;
  std::string hostname;
  std::shared_ptr<detail::Backend> comm;      // for device
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
    const bool mpi_up = watchdog && watchdog->mpi_up();
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
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (mpi_up && !finalized && clean) {
      watchdog->detach();
      local_boot.reset();
      boot.reset();
      if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
      if (world != MPI_COMM_NULL) MPI_Comm_free(&world);
      if (initialized_mpi) {
        if (board) board->set_phase(detail::Phase::finalizing);
        // Every rank waits here for all the others; a rank that never comes ends the job
        // after the deadline instead of hanging it. After a stop signal the launcher may be
        // taking the job down (mpirun and Slurm answer SIGTERM so) and then never completes
        // MPI_Finalize: the program has stopped cleanly, so leave after a few seconds.
        auto region =
            stop_signal_received.load() == 0
                ? watchdog->region("MPI_Finalize (every rank waits there for all the others)", timeout_s,
                                   detail::Phase::finalizing)
                : watchdog->quiet_region("MPI_Finalize after a stop signal", kFinalizeAfterStop_s,
                                         "MPI_Finalize did not return within 3 s of a clean stop (the "
                                         "launcher that sent the signal is ending the job); leaving without it.",
                                         0);
        MPI_Finalize();
        if (board) board->set_phase(detail::Phase::finished);
      }
    } else if (mpi_up && !finalized && unwinding && initialized_mpi) {
      // A rank stuck in MPI (or the other ranks, still waiting) would make MPI_Finalize hang.
      // The program's catch block runs and prints first; the process's exit ends the job.
      static std::once_flag registered;
      std::call_once(registered, [] { on_exit(abort_at_exit, nullptr); });
    }
    // A collective missed its deadline without aborting (broken): MPI cannot be finalized; the
    // program ends its processes itself (abort_on_timeout = false).
    if (watchdog) watchdog->detach(/*free_comm=*/false);
    watchdog.reset();
    board.reset();
    if (owns_slot) job_alive.store(false);
    owns_slot = false;
  }

  int take_board_comm() { return next_board_comm++; }
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

  int initialized = 0, finalized = 0;
  TUTTI_MPI_CHECK(MPI_Initialized(&initialized));
  TUTTI_MPI_CHECK(MPI_Finalized(&finalized));
  TUTTI_CHECK(!finalized, "MPI was finalized already (by an earlier Job or the program); MPI cannot start twice");
  j.mpi_allreduce = apply_mpi_allreduce(options.mpi_allreduce, !initialized);
  int provided = MPI_THREAD_SINGLE;
  if (j.board) j.board->set_phase(detail::Phase::mpi_init);
  if (!initialized) {
    // Every rank runs a compute thread and a communication thread, so a host's cores are
    // shared even with one rank per core. Open MPI busy-polls inside blocking calls; told to
    // yield while it waits, a waiting rank gives its core to the thread or rank that the
    // collective is waiting for (measured on 2 cores: a step's exposed communication fell
    // from ~25 ms to ~3 ms under load). The user's own setting wins.
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
    TUTTI_MPI_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided));
    j.initialized_mpi = true;
  } else {
    TUTTI_MPI_CHECK(MPI_Query_thread(&provided));
  }
  j.watchdog->mpi_ready();
  if (j.board) j.board->set_phase(detail::Phase::bootstrap);
  startup.set_what("the job's start-up (making its communicators)");
  TUTTI_CHECK(provided >= MPI_THREAD_MULTIPLE,
              "tutti needs MPI_THREAD_MULTIPLE (its communication threads call MPI "
              "while other threads may), but MPI provides thread level ",
              provided,
              j.initialized_mpi ? " (this MPI library lacks it)"
                                : " (initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...))");

  TUTTI_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &j.world));
  TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(j.world, MPI_ERRORS_RETURN));
  j.boot = std::make_unique<detail::MpiBootstrap>(j.world);
  j.rank = j.boot->rank();
  j.size = j.boot->size();
  set_error_rank(j.rank);
  j.watchdog->set_rank(j.rank, j.size);
  // From here on the ranks hear from each other when one fails.
  MPI_Comm control = MPI_COMM_NULL;
  TUTTI_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &control));
  j.watchdog->attach(control);
  ErrorContext context("setting up the job (rank " + std::to_string(j.rank) + " of " + std::to_string(j.size) + ")");
  TUTTI_MPI_CHECK(MPI_Comm_split_type(j.world, MPI_COMM_TYPE_SHARED, j.rank, MPI_INFO_NULL, &j.local));
  j.local_boot = std::make_unique<detail::MpiBootstrap>(j.local);
  j.local_rank = j.local_boot->rank();
  j.local_size = j.local_boot->size();
  j.board = detail::ProgressBoard::open_after_init(j.board, j.local, j.rank, j.size);
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
  const int leader = j.local_rank == 0 ? 1 : 0;
  TUTTI_MPI_CHECK(MPI_Allreduce(&leader, &j.node_count, 1, MPI_INT, MPI_SUM, j.world));
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
    j.comm = detail::make_nccl_backend(j.world, *j.boot, j.device, options.comm, j.take_board_comm());
    j.cpu_comm = detail::make_mpi_backend(j.world, Device::cpu(), options.comm, j.take_board_comm());
  } else {
    j.comm = detail::make_mpi_backend(j.world, j.device, options.comm, j.take_board_comm());
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
  if (j.board) j.board->set_phase(detail::Phase::running);
  detail::inject_fault(detail::FaultPoint::ready);
}

Job::~Job() = default;
Job::Job(Job&&) noexcept = default;
Job& Job::operator=(Job&&) noexcept = default;

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

std::string Job::mpi_version() const {
  int major = 0, minor = 0, len = 0;
  MPI_Get_version(&major, &minor);
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  MPI_Get_library_version(lib, &len);
  std::string first(lib, static_cast<std::size_t>(len));
  first = first.substr(0, first.find_first_of("\n,"));
  return "MPI " + std::to_string(major) + "." + std::to_string(minor) + ", " + first;
}

std::string Job::nccl_version() const { return detail::nccl_version(); }

std::shared_ptr<Communicator> Job::new_communicator(CommOptions options, std::string_view backend) {
  Impl& j = *impl_;
  TUTTI_CHECK_ARG(backend == "auto" || backend == "mpi" || backend == "nccl",
                  "Job::new_communicator: backend must be 'auto', 'mpi' or 'nccl', got '", std::string(backend), "'");
  const bool nccl = backend == "nccl" || (backend == "auto" && j.comm->backend() == "nccl");
  auto region = j.watchdog->region("Job::new_communicator (every rank waits there for all the others)", j.timeout_s);
  const int slot = j.take_board_comm();
  std::shared_ptr<detail::Backend> b =
      nccl ? detail::make_nccl_backend(j.world, *j.boot, j.device, std::move(options), slot)
           : detail::make_mpi_backend(j.world, j.device, std::move(options), slot);
  std::lock_guard lock(j.extra_mutex);
  j.extra.push_back(b);
  return b;
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

void Job::abort(std::string_view reason, int exit_code) {
  impl_->watchdog->end_job("aborting the job: " + std::string(reason), exit_code);
}

Job init(int& argc, char**& argv, JobOptions options) { return Job(argc, argv, std::move(options)); }

}  // namespace tutti
