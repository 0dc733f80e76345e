// Communicator::sendrecv on thread ranks (ThreadGroup): rotations and swaps at 1 to 4 ranks for
// every dtype against what each peer sent, the exchange with oneself, argument errors at the
// call, a count that differs on one rank (the same mismatch error as every collective), peers
// that do not pair up, and, with watchdogs, the agreement above 1 KiB (which must not compare
// the peers) and a rank that never calls it (named by the deadline's report).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_test_util.h"
#include "tutti/comm/thread_group.h"

namespace tutti {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Element i of rank r's input: distinct per rank and exact in every dtype.
float value(int r, std::int64_t i) { return static_cast<float>(r * 100 + i % 97) - 50.0f; }

Tensor input(int r, std::int64_t n, DType dtype) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = value(r, i);
  if (is_floating(dtype)) return Tensor::from_floats(v, {n}, dtype);
  return Tensor::from_ints(std::vector<std::int64_t>(v.begin(), v.end()), {n}, dtype);
}

using testing::values_of;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Every rank exchanges with its peers of `peers(rank)` = {send_to, recv_from}; its output must
// be its recv_from's input, and its input unchanged.
template <typename Peers>
void check_exchange(int world, DType dtype, std::int64_t n, Peers peers, const std::string& what) {
  ThreadGroup group(world);
  group.run([&](int r) {
    Communicator& c = group.communicator(r);
    const auto [to, from] = peers(r);
    const Tensor in = input(r, n, dtype);
    const Tensor out = Tensor::zeros({n}, dtype);
    Work work = c.sendrecv(in, out, to, from, {.label = what});
    EXPECT_EQ(work.info().kind, CollectiveKind::sendrecv);
    EXPECT_EQ(work.info().send_to, to);
    EXPECT_EQ(work.info().recv_from, from);
    work.wait();
    EXPECT_EQ(values_of(out), values_of(input(from, n, dtype)))
        << what << " " << name_of(dtype) << " n=" << n << " world " << world << ": rank " << r;
    EXPECT_EQ(values_of(in), values_of(input(r, n, dtype))) << what << ": the input is kept";
  });
}

std::pair<int, int> identity(int r) { return {r, r}; }

TEST(ThreadSendrecv, RotationsAndSwapsEveryDtype) {
  for (int w = 1; w <= 4; ++w) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64}) {
      for (std::int64_t n : {0, 1, 7, 1000}) {
        check_exchange(
            w, dtype, n,
            [w](int r) {
              return std::pair{(r + 1) % w, (r + w - 1) % w};
            },
            "rotation");
        check_exchange(
            w, dtype, n,
            [w](int r) {
              return std::pair{(r + w - 1) % w, (r + 1) % w};
            },
            "back rotation");
        // Pairs (0, 1), (2, 3); the last rank of an odd world exchanges with itself.
        check_exchange(
            w, dtype, n,
            [w](int r) {
              const int partner = (r ^ 1) < w ? (r ^ 1) : r;
              return std::pair{partner, partner};
            },
            "swap");
      }
    }
  }
}

TEST(ThreadSendrecv, EveryRankWithItselfCopies) {
  check_exchange(1, DType::f32, 5, identity, "alone");
  check_exchange(3, DType::bf16, 9, identity, "each with itself");
}

// Argument errors throw at the call, naming sendrecv, before anything is issued: the next
// collective is #1.
TEST(ThreadSendrecv, BadArgumentsThrowAtTheCall) {
  ThreadGroup group(2);
  group.run([&](int r) {
    Communicator& c = group.communicator(r);
    const Tensor in = Tensor::zeros({4}, DType::f32), out = Tensor::zeros({4}, DType::f32);
    auto expect_error = [&](auto&& call, const std::string& part) {
      try {
        call();
        ADD_FAILURE() << "no error for " << part;
      } catch (const InvalidArgument& e) {
        EXPECT_TRUE(contains(e.what(), part)) << e.what();
        EXPECT_TRUE(contains(e.what(), "[rank " + std::to_string(r) + "]")) << e.what();
      }
    };
    expect_error([&] { c.sendrecv(in, out, 2, 1 - r); }, "sendrecv: send_to 2 is not a rank of a world of 2");
    expect_error([&] { c.sendrecv(in, out, 1 - r, -1); }, "sendrecv: recv_from -1 is not a rank of a world of 2");
    expect_error([&] { c.sendrecv(in, out, r, 1 - r); }, "sendrecv: rank " + std::to_string(r) + " sends to rank");
    expect_error([&] { c.sendrecv(in, Tensor::zeros({5}, DType::f32), 1 - r, 1 - r); }, "differ in size");
    expect_error([&] { c.sendrecv(in, Tensor::zeros({4}, DType::i32), 1 - r, 1 - r); }, "dtypes must match");
    expect_error([&] { c.sendrecv(in, in, 1 - r, 1 - r); }, "overlap");
    const Tensor both = Tensor::zeros({6}, DType::f32);
    expect_error([&] { c.sendrecv(both.view(0, {4}), both.view(2, {4}), 1 - r, 1 - r); }, "overlap");
    expect_error([&] { c.sendrecv(Tensor(), out, 1 - r, 1 - r); }, "sendrecv: input is an undefined tensor");
    Work ok = c.sendrecv(input(r, 4, DType::f32), out, 1 - r, 1 - r);
    EXPECT_EQ(ok.info().seq, 1u);
    ok.wait();
    EXPECT_EQ(values_of(out), values_of(input(1 - r, 4, DType::f32)));
  });
}

// One rank passes another count: every rank fails with the mismatch error of any collective,
// naming both calls.
TEST(ThreadSendrecv, CountThatDiffersIsAMismatchOnEveryRank) {
  ThreadGroup group(3);
  std::vector<std::string> errors(3);
  group.run([&](int r) {
    const std::int64_t n = r == 1 ? 5 : 4;
    try {
      group.communicator(r)
          .sendrecv(Tensor::zeros({n}, DType::f32), Tensor::zeros({n}, DType::f32), (r + 1) % 3, (r + 2) % 3)
          .wait();
    } catch (const InvalidArgument& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_TRUE(contains(e,
                         "collective mismatch: rank 0 issued #1 sendrecv(to 1, from 2) 4 x f32 (16 B) but rank 1 "
                         "issued #1 sendrecv(to 2, from 0) 5 x f32 (20 B)"))
        << e;
  }
}

// Peers that are not a permutation: rank 0 sends to 1, but 1 receives from 2. Every rank's
// Work fails, naming the two calls that disagree.
TEST(ThreadSendrecv, PeersThatDoNotPairUpFailOnEveryRank) {
  ThreadGroup group(3);
  std::vector<std::string> errors(3);
  const std::pair<int, int> peers[3] = {{1, 2}, {2, 2}, {0, 1}};
  group.run([&](int r) {
    const auto [to, from] = peers[r];
    try {
      group.communicator(r).sendrecv(input(r, 3, DType::i32), Tensor::zeros({3}, DType::i32), to, from).wait();
    } catch (const InvalidArgument& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_TRUE(contains(e,
                         "sendrecv peers inconsistent: rank 0 issued #1 sendrecv(to 1, from 2) 3 x i32 (12 B) but "
                         "rank 1 issued #1 sendrecv(to 2, from 2) 3 x i32 (12 B)"))
        << e;
  }
}

ThreadGroupOptions watched(double timeout_s) {
  ThreadGroupOptions o;
  o.comm.timeout = std::chrono::duration<double>(timeout_s);
  o.comm.debug = false;
  o.watchdog = true;
  return o;
}

// With watchdogs, a sendrecv above 1 KiB is agreed on first, as on the mpi backend: the peers
// differ on every rank, and the agreement must not call that a mismatch; a count that differs
// must still be one (found by the agreement, before the deadline).
TEST(ThreadSendrecv, AgreementComparesCountNotPeers) {
  ThreadGroup group(3, watched(5.0));
  const std::int64_t n = 1000;  // 4000 B: agreed on
  group.run([&](int r) {
    Communicator& c = group.communicator(r);
    const Tensor out = Tensor::zeros({n}, DType::f32);
    c.sendrecv(input(r, n, DType::f32), out, (r + 1) % 3, (r + 2) % 3, {.label = "snapshot"}).wait();
    EXPECT_EQ(values_of(out), values_of(input((r + 2) % 3, n, DType::f32))) << "rank " << r;
  });
  ASSERT_FALSE(group.job_end().has_value()) << group.job_end()->cause;

  ThreadGroup mismatched(2, watched(5.0));
  std::vector<std::string> errors(2);
  const auto start = Clock::now();
  EXPECT_THROW(mismatched.run([&](int r) {
    const std::int64_t m = r == 0 ? n : n + 1;
    try {
      mismatched.communicator(r)
          .sendrecv(Tensor::zeros({m}, DType::f32), Tensor::zeros({m}, DType::f32), 1 - r, 1 - r)
          .wait();
    } catch (const InvalidArgument& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
      throw;
    }
  }),
               InvalidArgument);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0) << "found by the deadline";
  for (const std::string& e : errors) {
    EXPECT_TRUE(contains(e,
                         "collective mismatch: rank 0 issued #1 sendrecv 1000 x f32 (3.9 KiB) but rank 1 issued #1 "
                         "sendrecv 1001 x f32 (3.9 KiB)"))
        << e;
  }
}

// Rank 2 never calls sendrecv #2: the deadline fires on the ranks waiting in it, and the lowest
// (rank 0) reports it, naming the call (with its peers) and the rank that never came, as for a
// missing allreduce.
TEST(ThreadSendrecv, RankThatNeverCallsItIsNamedByTheDeadline) {
  ThreadGroup group(3, watched(0.3));
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(group.run([&](int r) {
    Communicator& c = group.communicator(r);
    const Tensor out = Tensor::zeros({10}, DType::f32);
    c.sendrecv(input(r, 10, DType::f32), out, (r + 1) % 3, (r + 2) % 3).wait();
    if (r == 2) {
      const auto start = Clock::now();
      while (!group.job_end() && Clock::now() - start < 10s) std::this_thread::sleep_for(1ms);
      return;
    }
    c.sendrecv(input(r, 10, DType::f32), out, (r + 1) % 3, (r + 2) % 3, {.label = "buddy snapshot"}).wait();
  }),
               TimeoutError);
  (void)::testing::internal::GetCapturedStderr();
  const auto end = group.job_end();
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->rank, 0);
  EXPECT_EQ(end->exit_code, 14);
  EXPECT_TRUE(contains(end->cause,
                       "TIMEOUT: collective #2 sendrecv(to 1, from 2) 10 x f32 (40 B) issued by 'buddy snapshot' on "
                       "backend thread"))
      << end->cause;
  EXPECT_TRUE(contains(end->cause, "Not reached by rank 2.")) << end->cause;
  EXPECT_TRUE(contains(end->cause, "rank 2: not there: last in #1 sendrecv 10 x f32 (40 B) (completed)")) << end->cause;
}

}  // namespace
}  // namespace tutti
