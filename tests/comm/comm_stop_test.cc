// Job::agree_stop under mpiexec (2 and 3 ranks): a stop signal that reaches one rank, not
// rank 0, is agreed by every rank, with the signal and the rank that received it.
#include <gtest/gtest.h>

#include <csignal>
#include <memory>

#include "tutti/comm/job.h"

namespace tutti {
namespace {

Job* the_job = nullptr;

TEST(JobStop, NoSignalNoStop) {
  const Job::StopAgreement a = the_job->agree_stop();
  EXPECT_FALSE(a.stop);
  EXPECT_EQ(a.signal, 0);
  EXPECT_EQ(a.rank, -1);
}

TEST(JobStop, SignalOnTheLastRankIsAgreedEverywhere) {
  Job& job = *the_job;
  ASSERT_GE(job.world_size(), 2) << "the signalled rank must not be rank 0";
  const int last = job.world_size() - 1;
  if (job.rank() == last) std::raise(SIGUSR1);
  // Each rank knows only its own signal...
  EXPECT_EQ(job.stop_requested(), job.rank() == last);
  EXPECT_EQ(job.stop_signal(), job.rank() == last ? SIGUSR1 : 0);
  // ...and agree_stop tells every rank the same.
  const Job::StopAgreement a = job.agree_stop();
  EXPECT_TRUE(a.stop);
  EXPECT_EQ(a.signal, SIGUSR1);
  EXPECT_EQ(a.rank, last);
  // A second signal on a lower rank (not rank 0 where there are 3): the lowest rank is named.
  if (job.world_size() >= 3 && job.rank() == 1) std::raise(SIGUSR2);
  const Job::StopAgreement b = job.agree_stop();
  EXPECT_TRUE(b.stop);
  EXPECT_EQ(b.rank, job.world_size() >= 3 ? 1 : last);
  EXPECT_EQ(b.signal, job.world_size() >= 3 ? SIGUSR2 : SIGUSR1);
}

}  // namespace
}  // namespace tutti

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tutti::JobOptions options;
  options.device = "cpu";
  options.catch_stop_signals = true;
  int rc = 0;
  {
    tutti::Job job(argc, argv, options);
    tutti::the_job = &job;
    rc = RUN_ALL_TESTS();
    tutti::the_job = nullptr;
  }
  return rc;
}
