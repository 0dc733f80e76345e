// The in-process communicator (tutti::ThreadGroup): every collective against its definition
// at 1 to 4 ranks, in place and not, for every dtype; the faults it injects (late, failing,
// out of order) behave as documented; a mismatch and a missing rank are clear errors; the
// bootstrap exchanges bytes.
#include "tutti/comm/thread_group.h"
#include "comm/comm_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

namespace tutti {
namespace {

using namespace std::chrono_literals;

// Element i of rank r's input: small integers, exact in every dtype and sum.
float value(int r, std::int64_t i) { return static_cast<float>((r * 5 + i * 3) % 11 - 5); }

Tensor input(int r, std::int64_t n, DType dtype) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = value(r, i);
  if (is_floating(dtype)) return Tensor::from_floats(v, {n}, dtype);
  std::vector<std::int64_t> iv(v.begin(), v.end());
  return Tensor::from_ints(iv, {n}, dtype);
}

using testing::values_of;

TEST(ThreadGroup, CollectivesAgainstTheirDefinitions) {
  for (int n = 1; n <= 4; ++n) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64}) {
      ThreadGroup group(n);
      const std::int64_t chunk = 7;
      group.run([&](int r) {
        Communicator& c = group.communicator(r);
        EXPECT_EQ(c.backend(), "thread");
        EXPECT_EQ(c.rank(), r);
        // allreduce sum, in place; max out of place.
        Tensor a = input(r, n * chunk, dtype);
        c.allreduce(a).wait();
        Tensor m = Tensor::zeros({n * chunk}, dtype);
        c.allreduce(input(r, n * chunk, dtype), m, ReduceOp::max).wait();
        const auto av = values_of(a), mv = values_of(m);
        for (std::int64_t i = 0; i < n * chunk; ++i) {
          double sum = 0, max = -1e9;
          for (int q = 0; q < n; ++q) {
            sum += value(q, i);
            max = std::max<double>(max, value(q, i));
          }
          ASSERT_EQ(av[static_cast<std::size_t>(i)], sum) << "allreduce " << name_of(dtype);
          ASSERT_EQ(mv[static_cast<std::size_t>(i)], max);
        }
        // reduce_scatter in place: output = input's rank-th chunk.
        Tensor rs = input(r, n * chunk, dtype);
        c.reduce_scatter(rs, rs.view(r * chunk, {chunk})).wait();
        const auto rv = values_of(rs);
        for (std::int64_t i = 0; i < chunk; ++i) {
          double sum = 0;
          for (int q = 0; q < n; ++q) sum += value(q, r * chunk + i);
          ASSERT_EQ(rv[static_cast<std::size_t>(r * chunk + i)], sum) << "reduce_scatter";
        }
        // allgather in place: input = output's rank-th chunk.
        Tensor all = Tensor::zeros({n * chunk}, dtype);
        all.view(r * chunk, {chunk}).copy_from(input(r, chunk, dtype));
        c.allgather(all.view(r * chunk, {chunk}), all).wait();
        const auto gv = values_of(all);
        for (int q = 0; q < n; ++q) {
          for (std::int64_t i = 0; i < chunk; ++i) ASSERT_EQ(gv[static_cast<std::size_t>(q * chunk + i)], value(q, i));
        }
        // broadcast from the last rank; barrier.
        Tensor b = input(r, chunk, dtype);
        c.broadcast(b, n - 1).wait();
        const auto bv = values_of(b);
        for (std::int64_t i = 0; i < chunk; ++i) ASSERT_EQ(bv[static_cast<std::size_t>(i)], value(n - 1, i));
        c.barrier().wait();
      });
    }
  }
}

TEST(ThreadGroup, HalvesAreSummedInFp32AndRoundedOnce) {
  ThreadGroup group(3);
  group.run([&](int r) {
    // 2048 + 8 + 8: in fp32 2064, which bf16 holds (its spacing there is 16); added pairwise in
    // bf16, 2048 + 8 is a tie that rounds to 2048, twice.
    Tensor t = Tensor::from_floats({r == 0 ? 2048.0f : 8.0f}, {1}, DType::bf16);
    group.communicator(r).allreduce(t).wait();
    EXPECT_EQ(t.to_floats()[0], 2064.0f);
    Tensor avg = Tensor::from_floats({static_cast<float>(r)}, {1}, DType::f32);
    group.communicator(r).allreduce(avg, ReduceOp::avg).wait();
    EXPECT_EQ(avg.to_floats()[0], 1.0f);
  });
}

TEST(ThreadGroup, LateFailingAndReorderedCollectives) {
  ThreadGroup group(2, {.timeout = std::chrono::seconds(10)});
  group.inject({.seq = 1, .rank = 1, .action = CollectiveFault::Action::delay, .delay = 100ms});
  group.inject({.seq = 2, .action = CollectiveFault::Action::fail});
  group.inject({.seq = 3, .action = CollectiveFault::Action::reorder, .after = 1});
  group.run([&](int r) {
    Communicator& c = group.communicator(r);
    Tensor t = Tensor::from_floats({1.0f}, {1});
    const auto t0 = std::chrono::steady_clock::now();
    Work late = c.allreduce(t);
    late.wait();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (r == 1) EXPECT_GE(ms, 90.0) << "rank 1's Work completes late";
    EXPECT_EQ(t.to_floats()[0], 2.0f);
    try {
      c.allreduce(t).wait();
      ADD_FAILURE() << "the failed collective must throw";
    } catch (const BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos) << e.what();
    }
    // #3 completes after #4: its output appears only then.
    Tensor x = Tensor::from_floats({1.0f}, {1}), y = Tensor::from_floats({1.0f}, {1});
    Work w3 = c.allreduce(x);
    Work w4 = c.allreduce(y);
    w4.wait();
    EXPECT_EQ(y.to_floats()[0], 2.0f);
    w3.wait();
    EXPECT_EQ(x.to_floats()[0], 2.0f);
  });
}

TEST(ThreadGroup, MismatchAndMissingRanksAreClearErrors) {
  ThreadGroup group(2, {.timeout = std::chrono::milliseconds(300)});
  std::vector<std::string> errors(2);
  group.run([&](int r) {
    Tensor t = Tensor::zeros({r == 0 ? 4 : 5}, DType::f32);
    try {
      group.communicator(r).allreduce(t).wait();
    } catch (const InvalidArgument& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("collective mismatch: rank 0 issued #1 allreduce(sum) 4"), std::string::npos) << e;
  std::string timeout;
  group.run([&](int r) {
    if (r == 1) return;
    try {
      group.communicator(r).barrier().wait();
    } catch (const TimeoutError& e) {
      timeout = e.what();
    }
  });
  EXPECT_NE(timeout.find("not issued by rank(s) 1"), std::string::npos) << timeout;
  EXPECT_THROW(group.communicator(0).allreduce(Tensor()), InvalidArgument);
}

TEST(ThreadGroup, BootstrapAndErrorRanks) {
  ThreadGroup group(3);
  group.run([&](int r) {
    Bootstrap& b = group.bootstrap(r);
    EXPECT_EQ(b.rank(), r);
    EXPECT_EQ(b.size(), 3);
    const auto all = b.allgather("rank " + std::to_string(r));
    ASSERT_EQ(all.size(), 3u);
    for (int q = 0; q < 3; ++q) EXPECT_EQ(all[static_cast<std::size_t>(q)], "rank " + std::to_string(q));
    EXPECT_EQ(b.broadcast(r == 2 ? "from two" : "", 2), "from two");
    b.barrier();
    EXPECT_EQ(error_rank(), r) << "each thread reports its own rank";
  });
  try {
    group.run([](int r) {
      if (r == 1) TUTTI_THROW(InvalidArgument, "planted");
    });
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[rank 1]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tutti
