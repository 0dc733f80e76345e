// A program for the fault tests (fault_test.py runs it under mpiexec and judges the whole job:
// exit code, time until every process is gone, what was printed). Faults come from the
// library's hook (TUTTI_FAULT, see src/comm/fault.h) or from the mode:
//
//   comm_fault_test idiom      the try/catch idiom of examples/hello_ranks.cc around a loop of
//                              allreduces: an exception leaves the Job's scope on the faulty
//                              rank; the catch prints "CAUGHT rank R: <what>" and returns 1.
//   comm_fault_test groups     the idiom's loop on the hierarchical allreduce over faked nodes of
//                              2 ranks (Job::node_groups, comm/groups.h): each step is 4
//                              collectives of this process (the allreduce, then the node
//                              reduce-scatter, the step across nodes, the node all-gather).
//   comm_fault_test terminate  the same loop without a catch: the exception escapes main.
//   comm_fault_test abort      the last rank calls job.abort("the test asked for it", 7).
//   comm_fault_test mismatch A B
//                              rank 0 allreduces A floats, the others B (in place, with guard
//                              bytes after the tensor): every rank must get an error naming
//                              the mismatch (or the job must end with a timeout report), and
//                              the guard bytes must be intact ("GUARD rank R: intact").
//
// Every rank prints "PID rank R <pid>" first, and "DONE rank R" if it gets to the end. With
// FAULT_TEST_SLOW_CATCH_RANK=R, rank R's catch block sleeps a second (FAULT_TEST_SLOW_CATCH_S)
// before it prints. The Job's
// device is FAULT_TEST_DEVICE (default cpu; "cuda" on the emulated device runs the nccl backend).
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tutti/comm/job.h"

namespace {

double now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

tutti::JobOptions cpu_options() {
  tutti::JobOptions options;
  const char* device = std::getenv("FAULT_TEST_DEVICE");
  options.device = device != nullptr ? device : "cpu";
  return options;
}

void hello(const tutti::Job& job) {
  std::printf("PID rank %d %d\n", job.rank(), static_cast<int>(getpid()));
  std::fflush(stdout);
}

// Allreduces (the faults hook into them) with a little work between them: 40, or
// FAULT_TEST_STEPS (the multi-node tests cut a node off while they run). Rank 0 prints "STEP k"
// after each.
void train_a_little(tutti::Job& job) {
  auto x = tutti::Tensor::zeros({1000}, tutti::DType::f32, job.device());
  const char* steps_env = std::getenv("FAULT_TEST_STEPS");
  const int steps = steps_env != nullptr ? std::atoi(steps_env) : 40;
  for (int i = 0; i < steps; ++i) {
    job.communicator().allreduce(x, tutti::ReduceOp::sum, {.label = "step " + std::to_string(i)}).wait();
    if (job.rank() == 0 && steps_env != nullptr) {
      std::printf("STEP %d\n", i);
      std::fflush(stdout);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The idiom every mode below follows: a Job, "PID rank", `body`; a tutti error is caught and
// printed ("CAUGHT rank R at T: ..."), exit 1; else "DONE rank R", exit 0.
template <class Body>
int with_job(int argc, char** argv, Body body) {
  // The launcher's number: the Job's constructor may be what throws.
  const char* env_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  int rank = env_rank != nullptr ? std::atoi(env_rank) : -1;
  try {
    tutti::Job job(argc, argv, cpu_options());
    rank = job.rank();
    hello(job);
    body(job);
  } catch (const std::exception& e) {
    // FAULT_TEST_SLOW_CATCH_RANK=R: rank R's catch block takes a second (a summary written, a
    // slow disk), or FAULT_TEST_SLOW_CATCH_S seconds, and what it prints must still come out.
    if (const char* slow = std::getenv("FAULT_TEST_SLOW_CATCH_RANK"); slow != nullptr && std::atoi(slow) == rank) {
      const char* s = std::getenv("FAULT_TEST_SLOW_CATCH_S");
      std::this_thread::sleep_for(std::chrono::duration<double>(s != nullptr ? std::atof(s) : 1.0));
    }
    std::fprintf(stderr, "CAUGHT rank %d at %.3f: %s\n", rank, now(), e.what());
    return 1;
  }
  std::printf("DONE rank %d\n", rank);
  return 0;
}

int idiom(int argc, char** argv) { return with_job(argc, argv, train_a_little); }

int groups(int argc, char** argv) {
  return with_job(argc, argv, [](tutti::Job& job) {
    auto hier = tutti::hierarchical_communicator(job.communicator(), job.node_groups({}, 2));
    auto x = tutti::Tensor::zeros({1000}, tutti::DType::f32, job.device());
    for (int i = 0; i < 40; ++i) {
      hier->allreduce(x, tutti::ReduceOp::sum, {.label = "step " + std::to_string(i)}).wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

int terminate(int argc, char** argv) {
  tutti::Job job(argc, argv, cpu_options());
  hello(job);
  train_a_little(job);  // an exception from here escapes main
  std::printf("DONE rank %d\n", job.rank());
  return 0;
}

int abort_mode(int argc, char** argv) {
  tutti::Job job(argc, argv, cpu_options());
  hello(job);
  auto x = tutti::Tensor::zeros({10}, tutti::DType::f32, job.device());
  job.communicator().allreduce(x).wait();
  if (job.rank() == job.world_size() - 1) {
    std::fprintf(stderr, "ABORT rank %d at %.3f\n", job.rank(), now());
    std::fflush(stderr);
    job.abort("the test asked for it", 7);
  }
  job.communicator().allreduce(x).wait();  // the others wait here for the aborting rank
  std::printf("DONE rank %d\n", job.rank());
  return 0;
}

int mismatch(int argc, char** argv, std::int64_t a, std::int64_t b) {
  tutti::Job job(argc, argv, cpu_options());
  hello(job);
  const std::int64_t n = job.rank() == 0 ? a : b;
  // The tensor, then guard bytes that a write past its end would change.
  constexpr std::int64_t kGuard = 1 << 20;  // floats
  auto storage = tutti::Tensor::zeros({n + kGuard}, tutti::DType::f32);
  auto* p = static_cast<float*>(storage.data());
  for (std::int64_t i = n; i < n + kGuard; ++i) p[i] = 12345.0f;
  const tutti::Tensor x = storage.view(0, {n});
  std::string verdict;
  try {
    job.communicator().allreduce(x, tutti::ReduceOp::sum, {.label = "mismatched"}).wait();
    verdict = "no error";
  } catch (const std::exception& e) {
    verdict = e.what();
  }
  bool intact = true;
  for (std::int64_t i = n; i < n + kGuard; ++i) intact = intact && p[i] == 12345.0f;
  std::printf("MISMATCH rank %d: %s\nGUARD rank %d: %s\n", job.rank(), verdict.c_str(), job.rank(),
              intact ? "intact" : "DAMAGED");
  std::fflush(stdout);
  // The communicator still works after an agreed mismatch.
  job.communicator().allreduce(x.view(0, {1}), tutti::ReduceOp::sum, {.label = "after"}).wait();
  std::printf("DONE rank %d\n", job.rank());
  return intact ? 0 : 3;
}

}  // namespace

// A call every rank must make, made by rank 0 only (the old job.h example): `what` is
// "summary" (Job::summary) or "collective" (an allreduce); the other ranks end their Jobs.
int one_sided(int argc, char** argv, const std::string& what) {
  return with_job(argc, argv, [&](tutti::Job& job) {
    if (job.rank() != 0) return;
    std::printf("ALONE at %.3f\n", now());
    std::fflush(stdout);
    if (what == "summary") {
      std::printf("%s\n", job.summary().c_str());
    } else {
      auto x = tutti::Tensor::zeros({1000}, tutti::DType::f32, job.device());
      job.communicator().allreduce(x, tutti::ReduceOp::sum, {.label = "rank 0 alone"}).wait();
    }
  });
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "idiom") return idiom(argc, argv);
  if (mode == "terminate") return terminate(argc, argv);
  if (mode == "groups") return groups(argc, argv);
  if (mode == "abort") return abort_mode(argc, argv);
  if (mode == "one_sided" && argc > 2) return one_sided(argc, argv, argv[2]);
  if (mode == "mismatch" && argc > 3) return mismatch(argc, argv, std::atoll(argv[2]), std::atoll(argv[3]));
  std::fprintf(stderr, "usage: %s idiom|groups|terminate|abort|one_sided summary|collective|mismatch A B\n", argv[0]);
  return 2;
}
