// The Job (ranks, local ranks, device, summary, check_same), CommOptions and the environment,
// argument errors, the loud defaults of the base class, fp32 accumulation of halves, debug-mode
// mismatch detection, and the agreement on large collectives outside debug mode.
#include <mpi.h>
#include <cmath>
#include <cstring>

#include <cstdlib>
#include <optional>

#include "comm/comm_test_util.h"
#include "comm/watchdog.h"
#include "tutti/comm/communicator.h"

namespace tutti::testing {
namespace {

// After a mismatch the communicator goes on working: an f32 allreduce of n elements (every rank
// alike) sums the ranks' inputs.
void expect_allreduce_sums(Communicator& comm, std::int64_t n, std::uint32_t salt, const std::string& when) {
  const Tensor y = make_input(DType::f32, comm.rank(), n, salt);
  comm.allreduce(y, ReduceOp::sum).wait();
  std::vector<double> expected(static_cast<std::size_t>(n), 0.0);
  for (int q = 0; q < comm.size(); ++q) {
    for (std::int64_t i = 0; i < n; ++i) expected[static_cast<std::size_t>(i)] += input_value(DType::f32, q, i, salt);
  }
  expect_values(values_of(y), expected, DType::f32, false, when);
}

TEST(CommJob, RanksMatchMpi) {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(job().rank(), rank);
  EXPECT_EQ(job().world_size(), size);
  EXPECT_EQ(error_rank(), rank);
  // All test ranks run on this one host.
  EXPECT_EQ(job().local_size(), size);
  EXPECT_EQ(job().local_rank(), rank);
  EXPECT_FALSE(job().hostname().empty());
  EXPECT_EQ(job().communicator().rank(), rank);
  EXPECT_EQ(job().communicator().size(), size);
  if (cuda_available()) {
    EXPECT_EQ(job().device(), Device::cuda(job().local_rank() % cuda_device_count()));
  } else {
    EXPECT_EQ(job().device(), Device::cpu());
    EXPECT_EQ(job().backend(), "mpi");
  }
  EXPECT_EQ(job().cpu_communicator().backend(), "mpi");
}

TEST(CommJob, SummaryNamesEveryRank) {
  const std::string s = job().summary();
  for (int r = 0; r < job().world_size(); ++r) {
    EXPECT_NE(
        s.find("rank " + std::to_string(r) + "/" + std::to_string(job().world_size()) + "  host " + job().hostname()),
        std::string::npos)
        << s;
  }
  EXPECT_NE(s.find("backend " + std::string(job().backend())), std::string::npos) << s;
  EXPECT_NE(s.find(job().mpi_version()), std::string::npos) << s;
  EXPECT_NE(s.find("NCCL " + job().nccl_version()), std::string::npos) << s;
  EXPECT_NE(s.find("MPI "), std::string::npos) << s;
}

// check_same: equal values pass on every rank; differing ones throw on every rank, naming
// `what` and which ranks have which value.
TEST(CommJob, CheckSameNamesTheRanksThatDisagree) {
  job().check_same("a number every rank has", 42);
  job().check_same("a text every rank has", "same");
  if (job().world_size() < 2) GTEST_SKIP() << "a disagreement needs two ranks";
  const int rank = job().rank();
  try {
    job().check_same("the data set's size", rank == 1 ? 59000 : 60000);
    ADD_FAILURE() << "no error on rank " << rank;
  } catch (const InvalidArgument& e) {
    std::string others = "'60000' on rank";
    if (job().world_size() > 2) {
      others += "s 0";
      for (int r = 2; r < job().world_size(); ++r) others += ", " + std::to_string(r);
    } else {
      others += " 0";
    }
    const std::string what = e.what();
    EXPECT_NE(what.find("ranks disagree on the data set's size: " + others +
                        "; '59000' on rank 1 (every rank must "
                        "have the same value)"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("[rank " + std::to_string(rank) + "]"), std::string::npos) << what;
  }
  // The job goes on.
  job().check_same("after a disagreement", "fine");
}

// Outside debug mode too, a collective that can move more than 1 KiB in one message is agreed
// on before its data moves: counts that differ fail on every rank with both descriptions (Open
// MPI would otherwise write past the smaller buffer), and the communicator goes on working.
TEST(CommAgreement, LargeCollectivesWithDifferentCountsFailOnEveryRank) {
  if (job().world_size() < 2) GTEST_SKIP() << "a mismatch needs two ranks";
  Communicator& comm = job().cpu_communicator();
  ASSERT_FALSE(comm.debug());
  const std::int64_t n = comm.rank() == 0 ? 4096 : 5000;  // 16 KiB and 20 KiB
  const Tensor x = Tensor::zeros({n}, DType::f32);
  const Work work = comm.allreduce(x, ReduceOp::sum, {.label = "counts differ"});
  const std::string seq = "#" + std::to_string(work.info().seq);
  expect_mismatch(work, {"collective mismatch: rank 0 issued " + seq + " allreduce(sum) 4096 x f32",
                         "rank 1 issued " + seq + " allreduce(sum) 5000 x f32"});
  expect_allreduce_sums(comm, 3000, 970, "after an agreed mismatch");  // 11.7 KiB: agreed on, and equal
}

// Outside debug mode, a large allreduce (its agreement carried in band by the data's own
// messages) against a large broadcast (agreed on before MPI moves its data) still fails on
// every rank with both descriptions, and the communicator goes on working.
TEST(CommAgreement, LargeCollectivesOfDifferentKindsFailOnEveryRank) {
  if (job().world_size() < 2) GTEST_SKIP() << "a mismatch needs two ranks";
  Communicator& comm = job().cpu_communicator();
  ASSERT_FALSE(comm.debug());
  const Tensor x = Tensor::zeros({4096}, DType::f32);  // 16 KiB
  const bool last = comm.rank() == comm.size() - 1;
  const Work work = last ? comm.broadcast(x, 0) : comm.allreduce(x, ReduceOp::sum, {.label = "kinds differ"});
  const std::string seq = "#" + std::to_string(work.info().seq);
  expect_mismatch(work,
                  {"collective mismatch: rank 0 issued " + seq + " allreduce(sum) 4096 x f32",
                   "rank " + std::to_string(comm.size() - 1) + " issued " + seq + " broadcast(root 0) 4096 x f32"});
  expect_allreduce_sums(comm, 3001, 980, "after a mismatch of kinds");  // odd, in band, and equal
}

// DDP relies on every rank getting the same bits from an allreduce, also where float sums
// round differently by order (the in-band algorithm reduces each element on one rank only).
TEST(CommAgreement, AllreduceGivesEveryRankTheSameBits) {
  Communicator& comm = job().cpu_communicator();
  constexpr std::int64_t n = 100003;  // odd, 391 KiB
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = std::sin(0.37f * (i + 1) * (comm.rank() + 1));
  const Tensor x = Tensor::from_floats(v, {n}, DType::f32);
  comm.allreduce(x, ReduceOp::sum).wait();
  const Tensor all = Tensor::zeros({n * comm.size()}, DType::f32);
  comm.allgather(x, all).wait();
  const auto* mine = static_cast<const float*>(x.data());
  const auto* every = static_cast<const float*>(all.data());
  for (int q = 0; q < comm.size(); ++q) {
    EXPECT_EQ(std::memcmp(every + q * n, mine, static_cast<std::size_t>(n) * sizeof(float)), 0)
        << "rank " << comm.rank() << " and rank " << q << " got different bits";
  }
}

// Sets an environment variable for the scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(CommOptions, TimeoutFromOptionThenEnvironmentThenDefault) {
  {
    ScopedEnv env("TUTTI_TIMEOUT_S", nullptr);
    EXPECT_EQ(CommOptions{}.timeout_seconds(), 300.0);
  }
  {
    ScopedEnv env("TUTTI_TIMEOUT_S", "12.5");
    EXPECT_EQ(CommOptions{}.timeout_seconds(), 12.5);
    EXPECT_EQ(CommOptions{.timeout = std::chrono::seconds(7)}.timeout_seconds(), 7.0);
  }
  {
    ScopedEnv env("TUTTI_TIMEOUT_S", "soon");
    EXPECT_THROW((void)CommOptions{}.timeout_seconds(), InvalidArgument);
  }
  {
    ScopedEnv env("TUTTI_TIMEOUT_S", "-3");
    EXPECT_THROW((void)CommOptions{}.timeout_seconds(), InvalidArgument);
  }
  EXPECT_THROW((void)CommOptions{.timeout = std::chrono::seconds(0)}.timeout_seconds(), InvalidArgument);
}

TEST(CommOptions, DebugFromOptionThenEnvironment) {
  {
    ScopedEnv env("TUTTI_DEBUG", nullptr);
    EXPECT_FALSE(CommOptions{}.debug_enabled());
  }
  {
    ScopedEnv env("TUTTI_DEBUG", "1");
    EXPECT_TRUE(CommOptions{}.debug_enabled());
    EXPECT_FALSE(CommOptions{.debug = false}.debug_enabled());
  }
  {
    ScopedEnv env("TUTTI_DEBUG", "maybe");
    EXPECT_THROW((void)CommOptions{}.debug_enabled(), InvalidArgument);
  }
}

TEST(CommTimeout, ReportSuggestsDebugModeOnlyWhenItIsOff) {
  const CollectiveInfo info{.seq = 3, .kind = CollectiveKind::barrier, .label = "test"};
  {
    const std::string report = detail::timeout_headline("mpi", info, 1.0, 1.5, 0, /*debug=*/false, {});
    EXPECT_NE(report.find("run with TUTTI_DEBUG=1"), std::string::npos) << report;
  }
  {
    const std::string report = detail::timeout_headline("mpi", info, 1.0, 1.5, 0, /*debug=*/true, {});
    EXPECT_EQ(report.find("run with TUTTI_DEBUG=1"), std::string::npos) << report;
    EXPECT_NE(report.find("Debug mode (TUTTI_DEBUG) is on and found no mismatch"), std::string::npos) << report;
  }
  {
    // Ranks that never got there are named, whatever the mode.
    const std::string report = detail::timeout_headline("mpi", info, 1.0, 1.5, 2, /*debug=*/false, {1, 3});
    EXPECT_NE(report.find("TIMEOUT: collective #3 barrier issued by 'test' on backend mpi did not complete within "
                          "its deadline of 1.0 s (waited 1.5 s); 2 more collective(s) queued behind it. Not reached by "
                          "rank 1, rank 3."),
              std::string::npos)
        << report;
  }
}

TEST(CommTimeout, ReportNamesStoppedRanksInsteadOfGuessing) {
  // Every rank reached the collective, one of them is stopped: that is the cause, not a
  // collective issued differently.
  const CollectiveInfo info{.seq = 4, .kind = CollectiveKind::barrier, .label = "test"};
  const std::string report = detail::timeout_headline("mpi", info, 1.0, 1.5, 0, /*debug=*/false, {}, {1});
  EXPECT_EQ(report.find("issued a different one"), std::string::npos) << report;
  EXPECT_NE(report.find(" Stopped: rank 1 (SIGSTOP, a debugger?): its process does not run until continued"),
            std::string::npos)
      << report;
  const std::string two = detail::timeout_headline("mpi", info, 1.0, 1.5, 0, /*debug=*/false, {2}, {1, 2});
  EXPECT_NE(two.find("Not reached by rank 2. Stopped: rank 1, rank 2 (SIGSTOP, a debugger?): their processes"),
            std::string::npos)
      << two;
}

TEST(CommInfo, DescribesTheCollective) {
  CollectiveInfo info{.seq = 17,
                      .kind = CollectiveKind::allreduce,
                      .op = ReduceOp::avg,
                      .dtype = DType::bf16,
                      .count = 1 << 20,
                      .root = -1,
                      .label = "ddp bucket 3"};
  EXPECT_EQ(info.str(), "#17 allreduce(avg) 1048576 x bf16 (2.0 MiB) issued by 'ddp bucket 3'");
  EXPECT_EQ(Work().info().seq, 0u);
  EXPECT_TRUE(Work().test());
}

// Argument errors throw at the call, on the rank that made them, before anything is issued
// (so every rank may check them alone).
TEST(CommErrors, BadArgumentsThrowAtTheCall) {
  Communicator& comm = job().cpu_communicator();
  const int w = comm.size();
  const Tensor f = Tensor::zeros({6}, DType::f32);
  EXPECT_THROW(comm.allreduce(f, Tensor::zeros({6}, DType::f16)), InvalidArgument);
  EXPECT_THROW(comm.allreduce(f, Tensor::zeros({5}, DType::f32)), InvalidArgument);
  EXPECT_THROW(comm.allreduce(Tensor()), InvalidArgument);
  EXPECT_THROW(comm.allreduce(Tensor::zeros({3}, DType::i32), ReduceOp::avg), InvalidArgument);
  EXPECT_THROW(comm.reduce_scatter(Tensor::zeros({3 * w + 1}, DType::f32), Tensor::zeros({3}, DType::f32)),
               InvalidArgument);
  EXPECT_THROW(comm.reduce_scatter(Tensor::zeros({3 * w}, DType::i64), Tensor::zeros({3}, DType::i64), ReduceOp::avg),
               InvalidArgument);
  EXPECT_THROW(comm.allgather(Tensor::zeros({3}, DType::f32), Tensor::zeros({3 * w + 1}, DType::f32)), InvalidArgument);
  EXPECT_THROW(comm.broadcast(f, w), InvalidArgument);
  EXPECT_THROW(comm.broadcast(f, -1), InvalidArgument);
  try {
    comm.allreduce(f, Tensor::zeros({5}, DType::f32), ReduceOp::sum, {.label = "bad sizes"});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("differ in size"), std::string::npos) << e.what();
  }
  // Nothing was issued: the next collective is right on every rank.
  const Tensor x = make_input(DType::i32, comm.rank(), 5, 900);
  comm.allreduce(x).wait();
  for (std::int64_t i = 0; i < 5; ++i) {
    double sum = 0;
    for (int q = 0; q < w; ++q) sum += input_value(DType::i32, q, i, 900);
    EXPECT_EQ(values_of(x)[static_cast<std::size_t>(i)], sum);
  }
}

// A GPU tensor given to a communicator that serves only the CPU fails loudly with the
// backend's name. (A wrapped pointer: nothing touches it.)
TEST(CommErrors, DeviceTheBackendDoesNotServe) {
  if (job().cpu_communicator().backend() == "mpi" && job().device().is_cuda() &&
      &job().cpu_communicator() == &job().communicator()) {
    GTEST_SKIP() << "this job's mpi communicator stages GPU tensors";
  }
  float dummy[4] = {};
  const Tensor gpu = Tensor::wrap(dummy, {4}, DType::f32, Device::cuda(0));
  try {
    job().cpu_communicator().allreduce(gpu);
    ADD_FAILURE() << "no error";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("Backend mpi"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
}

// The nccl backend takes tensors on its GPU only.
TEST(CommErrors, NcclRefusesCpuTensors) {
  TUTTI_COMM_REQUIRE_GPU();
  if (job().backend() != "nccl") GTEST_SKIP() << "this job's backend is " << job().backend() << ", not nccl";
  try {
    job().communicator().allreduce(Tensor::zeros({4}, DType::f32));
    ADD_FAILURE() << "no error";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("Backend nccl does not support tensors on cpu"), std::string::npos)
        << e.what();
  }
}

// A backend that implements nothing: every collective of the base fails with its name.
class NothingBackend : public Communicator {
 public:
  NothingBackend() : Communicator(0, 1, CommOptions{}) {}
  std::string_view backend() const override { return "nothing"; }
};

TEST(CommErrors, BaseMethodsFailLoudlyWithTheBackendName) {
  NothingBackend comm;
  const Tensor x = Tensor::zeros({4}, DType::f32);
  auto expect_unsupported = [](auto&& call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << what << ": no error";
    } catch (const BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("Backend nothing does not support " + what), std::string::npos) << e.what();
    }
  };
  expect_unsupported([&] { comm.allreduce(x); }, "allreduce");
  expect_unsupported([&] { comm.reduce_scatter(x, x); }, "reduce_scatter");
  expect_unsupported([&] { comm.allgather(x, x); }, "allgather");
  expect_unsupported([&] { comm.broadcast(x, 0); }, "broadcast");
  expect_unsupported([&] { comm.barrier(); }, "barrier");
  expect_unsupported([&] { comm.sendrecv(x, Tensor::zeros({4}, DType::f32), 0, 0); }, "sendrecv");
}

// Halves are summed in fp32 and rounded once: 1 + (n-1) tiny values, each below half a unit
// in the last place of 1, vanish when added to 1 one by one in the half type, but not in fp32.
TEST(CommHalves, SumAccumulatesInFp32) {
  Communicator& comm = job().cpu_communicator();
  const int r = comm.rank(), w = comm.size();
  for (DType dtype : {DType::f16, DType::bf16}) {
    const double tiny = dtype == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    const float mine = static_cast<float>(r == 0 ? 1.0 : tiny);
    const Tensor x = Tensor::from_floats({mine, -mine, 2 * mine}, {3}, dtype);
    comm.allreduce(x, ReduceOp::sum, {.label = "fp32 accumulation"}).wait();
    const double s = 1.0 + (w - 1) * tiny;
    expect_values(values_of(x), {round_to(dtype, s), round_to(dtype, -s), round_to(dtype, 2 * s)}, dtype, true,
                  std::string(name_of(dtype)) + " sum of 1 and " + std::to_string(w - 1) + " tiny values");
  }
}

// Debug mode: ranks that disagree on a collective get an error naming the ranks and both
// descriptions (every rank the same error), and the communicator goes on working.
class CommDebug : public ::testing::Test {
 protected:
  void SetUp() override {
    if (job().world_size() < 2) GTEST_SKIP() << "a mismatch needs two ranks";
    static std::shared_ptr<Communicator> debug_comm =
        job().new_communicator({.timeout = std::chrono::seconds(30), .debug = true}, "mpi");
    comm_ = debug_comm.get();
    ASSERT_TRUE(comm_->debug());
  }
  void expect_still_works() {
    const Tensor x = make_input(DType::i64, comm_->rank(), 9, 950);
    comm_->allreduce(x, ReduceOp::min).wait();
    std::vector<double> expected;
    for (std::int64_t i = 0; i < 9; ++i) {
      double m = input_value(DType::i64, 0, i, 950);
      for (int q = 1; q < comm_->size(); ++q) m = std::min(m, input_value(DType::i64, q, i, 950));
      expected.push_back(m);
    }
    expect_values(values_of(x), expected, DType::i64, true, "after a mismatch");
  }
  Communicator* comm_ = nullptr;
};

TEST_F(CommDebug, MismatchedCounts) {
  const bool first = comm_->rank() == 0;
  const Tensor x = Tensor::zeros({first ? 10 : 11}, DType::f32);
  const Work work = comm_->allreduce(x, ReduceOp::sum, {.label = "counts"});
  const std::string seq = "#" + std::to_string(work.info().seq);
  expect_mismatch(
      work, {"rank 0 issued " + seq + " allreduce(sum) 10 x f32", "rank 1 issued " + seq + " allreduce(sum) 11 x f32"});
  expect_still_works();
}

TEST_F(CommDebug, MismatchedDtypes) {
  const bool first = comm_->rank() == 0;
  const Tensor x = Tensor::zeros({8}, first ? DType::f32 : DType::bf16);
  const Work work = comm_->allreduce(x, ReduceOp::max, {.label = "dtypes"});
  expect_mismatch(work, {"rank 0 issued", "allreduce(max) 8 x f32", "rank 1 issued", "allreduce(max) 8 x bf16"});
  expect_still_works();
}

TEST_F(CommDebug, MismatchedCollectives) {
  const Tensor x = Tensor::zeros({8}, DType::f32);
  const Work work = comm_->rank() == 0 ? comm_->allreduce(x) : comm_->broadcast(x, 0);
  expect_mismatch(work, {"allreduce(sum) 8 x f32", "broadcast(root 0) 8 x f32"});
  expect_still_works();
}

TEST_F(CommDebug, MatchingCollectivesPass) {
  const Tensor x = make_input(DType::f32, comm_->rank(), 100, 960);
  const Tensor out = Tensor::zeros({100 * comm_->size()}, DType::f32);
  comm_->allgather(x, out).wait();
  std::vector<double> expected;
  for (int q = 0; q < comm_->size(); ++q) {
    for (std::int64_t i = 0; i < 100; ++i) expected.push_back(input_value(DType::f32, q, i, 960));
  }
  expect_values(values_of(out), expected, DType::f32, true, "debug allgather");
}

}  // namespace
}  // namespace tutti::testing
