// The watchdog and the progress board on thread ranks (ThreadGroupOptions::watchdog): the same
// Watchdog code as under mpirun, with the in-process control channel, so that a failing rank is
// judged in one process, deterministically, in well under a second. The whole-job view (exit
// codes, every process gone) stays with fault_test.py under mpirun.
//
// Each case names what would make it fail: the watchdog's deadline check, the agreement over
// the control channel, the notice a leaving rank sends.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tutti/comm/thread_group.h"
#include "tutti/core/error.h"

namespace tutti {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

ThreadGroupOptions watched(double timeout_s) {
  ThreadGroupOptions o;
  o.comm.timeout = std::chrono::duration<double>(timeout_s);
  o.comm.debug = false;
  o.watchdog = true;
  return o;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Stalls a rank until its group's job has ended (bounded, so a broken watchdog fails the test).
void wait_for_end(const ThreadGroup& group) {
  const auto start = Clock::now();
  while (!group.job_end() && seconds_since(start) < 10) std::this_thread::sleep_for(1ms);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A rank throws between two collectives: the others, waiting in the second, end promptly with
// that rank's cause (its notice, then the end of the job: what ~Job does under mpirun), long
// before their deadline. Fails when the leaving rank sends no notice (Watchdog::leave) or does
// not end the job (Watchdog::left).
TEST(Watchdog, ThrowingRankEndsTheOthersWithItsCause) {
  const double deadline = 6.0;
  ThreadGroup group(3, watched(deadline));
  std::vector<std::string> errors(3);
  std::vector<double> waited(3, -1);
  std::atomic<std::int64_t> thrown_at{0};
  testing::internal::CaptureStderr();
  EXPECT_THROW(group.run([&](int r) {
    Communicator& c = group.communicator(r);
    Tensor x = Tensor::from_floats(std::vector<float>(4, 1.0f), {4});
    c.allreduce(x).wait();
    if (r == 2) {
      thrown_at = Clock::now().time_since_epoch().count();
      TUTTI_THROW(InvalidArgument, "boom on rank 2");
    }
    try {
      c.allreduce(x).wait();
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
      waited[static_cast<std::size_t>(r)] = seconds_since(Clock::time_point(Clock::duration(thrown_at.load())));
      throw;
    }
  }),
               Error);
  const std::string printed = testing::internal::GetCapturedStderr();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const std::string& e = errors[static_cast<std::size_t>(r)];
    EXPECT_TRUE(contains(e, "rank 2 failed")) << e;
    EXPECT_TRUE(contains(e, "boom on rank 2")) << e;
    EXPECT_GE(waited[static_cast<std::size_t>(r)], 0);
    EXPECT_LT(waited[static_cast<std::size_t>(r)], deadline / 2) << "ended by the deadline, not by rank 2";
    // Its watchdog heard of rank 2 before the job ended (the notice, not only the end).
    EXPECT_TRUE(contains(printed, "tutti [rank " + std::to_string(r) + "]: rank 2 failed: ")) << printed;
  }
  const auto end = group.job_end();
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->rank, 2);
  EXPECT_EQ(end->exit_code, 1);
  EXPECT_TRUE(contains(end->cause, "boom on rank 2")) << end->cause;
}

// Rank 2 never issues collective #2: the deadline fires on the ranks waiting in it; the lowest
// of them (rank 0) reports, naming the rank that never came and the collective, with where
// every rank is (from the progress board), and ends the job; rank 1 defers to it. Fails when
// the watchdog does not check its backends' deadlines (Watchdog::poll_backends).
TEST(Watchdog, StalledRankIsNamedWhenTheDeadlineFires) {
  const double deadline = 0.3;
  ThreadGroup group(3, watched(deadline));
  std::vector<std::string> errors(3);
  std::vector<double> waited(3, -1);
  testing::internal::CaptureStderr();
  EXPECT_THROW(group.run([&](int r) {
    Communicator& c = group.communicator(r);
    Tensor x = Tensor::from_floats(std::vector<float>(10, 1.0f), {10});
    c.allreduce(x, ReduceOp::sum, CallOptions{.label = "warm-up"}).wait();
    if (r == 2) {
      wait_for_end(group);
      return;
    }
    const auto start = Clock::now();
    try {
      c.allreduce(x, ReduceOp::sum, CallOptions{.label = "grads"}).wait();
    } catch (const TimeoutError& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
      waited[static_cast<std::size_t>(r)] = seconds_since(start);
      throw;
    }
  }),
               TimeoutError);
  const std::string printed = testing::internal::GetCapturedStderr();
  const auto end = group.job_end();
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->rank, 0);
  EXPECT_EQ(end->exit_code, 14);
  EXPECT_TRUE(contains(end->cause,
                       "TIMEOUT: collective #2 allreduce(sum) 10 x f32 (40 B) issued by 'grads' on "
                       "backend thread"))
      << end->cause;
  EXPECT_TRUE(contains(end->cause, "Not reached by rank 2.")) << end->cause;
  EXPECT_TRUE(contains(end->cause, "rank 1: in it for")) << end->cause;
  EXPECT_TRUE(contains(end->cause,
                       "rank 2: not there: last in #1 allreduce(sum) 10 x f32 (40 B) issued by "
                       "'warm-up' (completed)"))
      << end->cause;
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(contains(errors[static_cast<std::size_t>(r)], "Not reached by rank 2."))
        << errors[static_cast<std::size_t>(r)];
    EXPECT_GE(waited[static_cast<std::size_t>(r)], deadline);
    EXPECT_LT(waited[static_cast<std::size_t>(r)], deadline + 2.5);
  }
  // One report (rank 0's); rank 1 only says that rank 0 ends the job.
  EXPECT_TRUE(contains(printed, "tutti [rank 0]: TIMEOUT: collective #2")) << printed;
  EXPECT_FALSE(contains(printed, "tutti [rank 1]: TIMEOUT")) << printed;
  EXPECT_TRUE(contains(printed, "tutti [rank 1]: rank 0 is ending the job: TIMEOUT")) << printed;
}

// The same stall where no rank can read another's slot (TUTTI_PROGRESS_BOARD=private: as if
// every rank ran on a host of its own): the reporting rank asks the others over the control
// channel where they are, and the report still locates the stalled rank. Fails when status
// requests go unanswered (then: "rank 2: no answer").
TEST(Watchdog, StalledRankIsLocatedOverTheControlChannel) {
  ::setenv("TUTTI_PROGRESS_BOARD", "private", 1);
  ThreadGroup group(3, watched(0.3));
  ::unsetenv("TUTTI_PROGRESS_BOARD");
  testing::internal::CaptureStderr();
  EXPECT_THROW(group.run([&](int r) {
    Communicator& c = group.communicator(r);
    Tensor x = Tensor::from_floats(std::vector<float>(10, 1.0f), {10});
    c.allreduce(x).wait();
    if (r == 2) return wait_for_end(group);
    c.allreduce(x).wait();
  }),
               TimeoutError);
  (void)testing::internal::GetCapturedStderr();
  const auto end = group.job_end();
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->rank, 0);
  EXPECT_TRUE(contains(end->cause, "Not reached by rank 2.")) << end->cause;
  EXPECT_TRUE(contains(end->cause, "rank 1: in it for")) << end->cause;
  EXPECT_TRUE(contains(end->cause, "rank 2: not there: last in #1 allreduce(sum) 10 x f32 (40 B) (completed)"))
      << end->cause;
}

// Rank 1 issues a broadcast where rank 0 issues an allreduce (both above the 1 KiB agreement
// threshold): the agreement over the control channel finds it before any data moves, and both
// ranks fail with an error naming both calls; as every rank leaves alike, nobody ends the job.
// Fails without the agreement (the calls then never complete, as on a real transport, and only
// the deadline, much later, says that some rank issued something else).
TEST(Watchdog, DifferentCollectiveIsReportedNamingBoth) {
  const double deadline = 3.0;
  ThreadGroup group(2, watched(deadline));
  std::vector<std::string> errors(2);
  const auto start = Clock::now();
  EXPECT_THROW(group.run([&](int r) {
    Communicator& c = group.communicator(r);
    Tensor x = Tensor::from_floats(std::vector<float>(1000, 1.0f), {1000});
    try {
      (r == 0 ? c.allreduce(x) : c.broadcast(x, 0)).wait();
    } catch (const InvalidArgument& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
      throw;
    }
  }),
               InvalidArgument);
  EXPECT_LT(seconds_since(start), deadline) << "found by the deadline, not by the agreement";
  for (int r = 0; r < 2; ++r) {
    const std::string& e = errors[static_cast<std::size_t>(r)];
    EXPECT_TRUE(contains(e,
                         "collective mismatch: rank 0 issued #1 allreduce(sum) 1000 x f32 (3.9 KiB) but rank 1 "
                         "issued #1 broadcast(root 0) 1000 x f32 (3.9 KiB)"))
        << "rank " << r << ": " << e;
  }
  EXPECT_FALSE(group.job_end().has_value()) << group.job_end()->cause;
}

// abort_on_timeout = false: the watchdog reports the missed deadline to the communicator, which
// fails the Work and everything behind it and refuses later collectives; the job goes on.
TEST(Watchdog, DeadlineWithoutAbortBreaksOnlyTheCommunicator) {
  ThreadGroupOptions options = watched(0.2);
  options.comm.abort_on_timeout = false;
  ThreadGroup group(2, options);
  std::string first, later;
  testing::internal::CaptureStderr();
  group.run([&](int r) {
    Communicator& c = group.communicator(r);
    if (r == 1) return;  // never issues anything
    Tensor x = Tensor::from_floats(std::vector<float>(10, 1.0f), {10});
    Work a = c.allreduce(x);
    Work b = c.allreduce(x);
    EXPECT_THROW(a.wait(), TimeoutError);
    try {
      b.wait();
    } catch (const TimeoutError& e) {
      first = e.what();
    }
    try {
      c.allreduce(x).wait();
    } catch (const TimeoutError& e) {
      later = e.what();
    }
  });
  (void)testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(first, "TIMEOUT: collective #1 allreduce(sum)")) << first;
  EXPECT_TRUE(contains(first, "Not reached by rank 1.")) << first;
  EXPECT_TRUE(contains(later, "communicator unusable")) << later;
  EXPECT_FALSE(group.job_end().has_value());
}

}  // namespace
}  // namespace tutti
