// Every collective, every dtype, sizes 0, 1, odd, not divisible by the world size, and several
// MB, in place and out of place, checked against the arithmetic done here from every rank's
// inputs (exact for integers, max and min; within the dtype's precision for float sums).
// Each test runs on three targets: CPU tensors (mpi), GPU tensors on the job's communicator
// (nccl where each rank has a GPU of its own), and GPU tensors staged through the host (mpi).
#include <algorithm>
#include <chrono>
#include <thread>

#include "comm/comm_test_util.h"
#include "tutti/comm/communicator.h"

namespace tutti::testing {
namespace {

const DType kAllDtypes[] = {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64};
const ReduceOp kAllOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

double combine(ReduceOp op, DType dtype, const std::vector<double>& v) {
  double r = v[0];
  for (std::size_t i = 1; i < v.size(); ++i) {
    if (op == ReduceOp::sum || op == ReduceOp::avg) r += v[i];
    if (op == ReduceOp::max) r = std::max(r, v[i]);
    if (op == ReduceOp::min) r = std::min(r, v[i]);
  }
  if (op == ReduceOp::avg) r /= static_cast<double>(v.size());
  return is_floating(dtype) ? round_to(dtype, r) : r;
}

// op over ranks of element `i` of the inputs of test case `seed`.
double reduced(ReduceOp op, DType dtype, int world, std::int64_t i, std::uint32_t seed) {
  // Called per element of several-megabyte cases: one vector per thread, not one per element
  // (malloc and free were 16% of SeveralMegabytes/cpu at np 3).
  thread_local std::vector<double> v;
  v.clear();
  for (int q = 0; q < world; ++q) v.push_back(input_value(dtype, q, i, seed));
  return combine(op, dtype, v);
}

bool exact(ReduceOp op, DType dtype) { return !is_floating(dtype) || op == ReduceOp::max || op == ReduceOp::min; }

std::string case_name(const char* what, DType dtype, std::int64_t n, bool in_place, const char* extra = "") {
  return std::string(what) + " " + std::string(name_of(dtype)) + " n=" + std::to_string(n) +
         (in_place ? " in place" : " out of place") + extra;
}

class Collectives : public DataPathTest {
 protected:
  Tensor on_device(const Tensor& t) const { return t.to(device_); }

  void check_allreduce(DType dtype, ReduceOp op, std::int64_t n, bool in_place, std::uint32_t seed) {
    const int r = comm_->rank(), w = comm_->size();
    const Tensor in = on_device(make_input(dtype, r, n, seed));
    const Tensor out = in_place ? in : Tensor::zeros({n}, dtype, device_);
    const std::string what = case_name("allreduce", dtype, n, in_place) + " " + std::string(name_of(op));
    comm_->allreduce(in, out, op, {.label = what}).wait();
    std::vector<double> expected(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) expected[static_cast<std::size_t>(i)] = reduced(op, dtype, w, i, seed);
    expect_values(values_of(out), expected, dtype, exact(op, dtype), what);
    if (!in_place)
      expect_values(values_of(in), values_of(make_input(dtype, r, n, seed)), dtype, true, what + " (input kept)");
  }

  void check_reduce_scatter(DType dtype, ReduceOp op, std::int64_t n, bool in_place, std::uint32_t seed) {
    const int r = comm_->rank(), w = comm_->size();
    const Tensor original = make_input(dtype, r, n * w, seed);
    const Tensor in = on_device(original);
    const Tensor out = in_place ? in.view(r * n, {n}) : Tensor::zeros({n}, dtype, device_);
    const std::string what = case_name("reduce_scatter", dtype, n, in_place) + " " + std::string(name_of(op));
    comm_->reduce_scatter(in, out, op, {.label = what}).wait();
    std::vector<double> expected(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) expected[static_cast<std::size_t>(i)] = reduced(op, dtype, w, r * n + i, seed);
    expect_values(values_of(out), expected, dtype, exact(op, dtype), what);
    // The rest of the input is unchanged (all of it out of place).
    std::vector<double> rest = values_of(in), rest_expected = values_of(original);
    if (in_place) {
      rest.erase(rest.begin() + r * n, rest.begin() + (r + 1) * n);
      rest_expected.erase(rest_expected.begin() + r * n, rest_expected.begin() + (r + 1) * n);
    }
    expect_values(rest, rest_expected, dtype, true, what + " (rest of the input kept)");
  }

  void check_allgather(DType dtype, std::int64_t n, bool in_place, std::uint32_t seed) {
    const int r = comm_->rank(), w = comm_->size();
    const Tensor mine = make_input(dtype, r, n, seed);
    const Tensor out = Tensor::zeros({n * w}, dtype, device_);
    Tensor in;
    if (in_place) {
      in = out.view(r * n, {n});
      in.copy_from(mine);
    } else {
      in = on_device(mine);
    }
    const std::string what = case_name("allgather", dtype, n, in_place);
    comm_->allgather(in, out, {.label = what}).wait();
    std::vector<double> expected;
    for (int q = 0; q < w; ++q) {
      for (std::int64_t i = 0; i < n; ++i) expected.push_back(input_value(dtype, q, i, seed));
    }
    expect_values(values_of(out), expected, dtype, true, what);
  }

  void check_broadcast(DType dtype, std::int64_t n, int root, bool in_place, std::uint32_t seed) {
    const int r = comm_->rank();
    const Tensor mine = on_device(make_input(dtype, r, n, seed));
    const std::string what = case_name("broadcast", dtype, n, in_place, (" root " + std::to_string(root)).c_str());
    Tensor result = mine;
    if (in_place) {
      comm_->broadcast(mine, root, {.label = what}).wait();
    } else {
      result = Tensor::zeros({n}, dtype, device_);
      comm_->broadcast(mine, result, root, {.label = what}).wait();
      expect_values(values_of(mine), values_of(make_input(dtype, r, n, seed)), dtype, true, what + " (input kept)");
    }
    expect_values(values_of(result), values_of(make_input(dtype, root, n, seed)), dtype, true, what);
  }
};

TEST_P(Collectives, AllreduceEveryOpDtypeAndSize) {
  std::uint32_t seed = 100;
  for (DType dtype : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      if (op == ReduceOp::avg && !is_floating(dtype)) continue;  // refused, see CommErrors
      for (std::int64_t n : {0, 1, 7, 1001}) {
        for (bool in_place : {true, false}) check_allreduce(dtype, op, n, in_place, ++seed);
      }
    }
  }
}

TEST_P(Collectives, ReduceScatterEveryOpDtypeAndSize) {
  std::uint32_t seed = 200;
  for (DType dtype : kAllDtypes) {
    for (ReduceOp op : kAllOps) {
      if (op == ReduceOp::avg && !is_floating(dtype)) continue;
      for (std::int64_t n : {0, 1, 7, 333}) {
        for (bool in_place : {true, false}) check_reduce_scatter(dtype, op, n, in_place, ++seed);
      }
    }
  }
}

TEST_P(Collectives, AllgatherEveryDtypeAndSize) {
  std::uint32_t seed = 300;
  for (DType dtype : kAllDtypes) {
    for (std::int64_t n : {0, 1, 7, 333}) {
      for (bool in_place : {true, false}) check_allgather(dtype, n, in_place, ++seed);
    }
  }
}

TEST_P(Collectives, BroadcastEveryDtypeSizeAndRoot) {
  std::uint32_t seed = 400;
  for (DType dtype : kAllDtypes) {
    for (std::int64_t n : {0, 1, 1001}) {
      for (int root = 0; root < comm_->size(); ++root) {
        for (bool in_place : {true, false}) check_broadcast(dtype, n, root, in_place, ++seed);
      }
    }
  }
}

// Several MB: 4 MiB per dtype, once, (sum, in place; and max out of place for one dtype).
TEST_P(Collectives, SeveralMegabytes) {
  std::uint32_t seed = 500;
  for (DType dtype : kAllDtypes) {
    const std::int64_t n = (std::int64_t{4} << 20) / static_cast<std::int64_t>(size_of(dtype)) + 3;
    check_allreduce(dtype, ReduceOp::sum, n, /*in_place=*/true, ++seed);
  }
  check_allreduce(DType::bf16, ReduceOp::max, (std::int64_t{4} << 20) / 2 + 1, /*in_place=*/false, ++seed);
  check_reduce_scatter(DType::f32, ReduceOp::sum, (std::int64_t{1} << 20) / comm_->size() + 5, false, ++seed);
  check_allgather(DType::f16, (std::int64_t{1} << 20) / comm_->size() + 5, false, ++seed);
}

// A completed collective on the mpi backend reports how long it ran; an unfinished one
// and a default Work report nothing.
TEST_P(Collectives, RunTimeOfACompletedCollective) {
  EXPECT_FALSE(Work().run_ms().has_value());
  const Tensor t = Tensor::zeros({1 << 16}, DType::f32, device_);
  const auto t0 = std::chrono::steady_clock::now();
  Work work = comm_->allreduce(t);
  work.wait();
  const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (comm_->backend() != "mpi") {
    EXPECT_FALSE(work.run_ms().has_value()) << comm_->backend() << " does not time its collectives";
    return;
  }
  ASSERT_TRUE(work.run_ms().has_value());
  EXPECT_GE(*work.run_ms(), 0.0);
  EXPECT_LE(*work.run_ms(), waited_ms);
}

// Many collectives in flight at once, of different kinds and sizes, all issued before any is
// waited for: every one is right, and they complete in issue order.
TEST_P(Collectives, ManyInFlightCompleteInOrderAndCorrectly) {
  const int r = comm_->rank(), w = comm_->size();
  struct Issued {
    Work work;
    Tensor out;
    std::vector<double> expected;
    DType dtype;
    bool exact;
  };
  std::vector<Issued> issued;
  for (int k = 0; k < 48; ++k) {
    const std::uint32_t seed = 600 + static_cast<std::uint32_t>(k);
    const DType dtype = kAllDtypes[k % 5];
    const std::int64_t n = 1 + (k * 37) % 2000;
    Issued it{Work(), Tensor(), {}, dtype, true};
    const std::string label = "in flight #" + std::to_string(k);
    if (k % 3 == 0) {
      const ReduceOp op = is_floating(dtype) ? kAllOps[(k / 3) % 4] : ReduceOp::max;
      it.out = on_device(make_input(dtype, r, n, seed));
      it.work = comm_->allreduce(it.out, op, {.label = label});
      for (std::int64_t i = 0; i < n; ++i) it.expected.push_back(reduced(op, dtype, w, i, seed));
      it.exact = exact(op, dtype);
    } else if (k % 3 == 1) {
      it.out = Tensor::zeros({n * w}, dtype, device_);
      it.work = comm_->allgather(on_device(make_input(dtype, r, n, seed)), it.out, {.label = label});
      for (int q = 0; q < w; ++q) {
        for (std::int64_t i = 0; i < n; ++i) it.expected.push_back(input_value(dtype, q, i, seed));
      }
    } else {
      const int root = k % w;
      it.out = on_device(make_input(dtype, r, n, seed));
      it.work = comm_->broadcast(it.out, root, {.label = label});
      it.expected = values_of(make_input(dtype, root, n, seed));
    }
    issued.push_back(std::move(it));
  }
  // Sequence numbers follow issue order.
  for (std::size_t k = 1; k < issued.size(); ++k) {
    EXPECT_EQ(issued[k].work.info().seq, issued[k - 1].work.info().seq + 1);
  }
  // Wait for the last first: then every earlier one must be complete already.
  for (std::size_t k = issued.size(); k-- > 0;) {
    issued[k].work.wait();
    for (std::size_t j = 0; j < k; ++j) EXPECT_TRUE(issued[j].work.test()) << "collective " << j << " before " << k;
    expect_values(values_of(issued[k].out), issued[k].expected, issued[k].dtype, issued[k].exact,
                  "in flight #" + std::to_string(k));
  }
}

// The collective makes progress while the caller does not wait: test() turns true by itself.
TEST_P(Collectives, ProgressesWithoutWaiting) {
  const Tensor x = on_device(make_input(DType::f32, comm_->rank(), 1 << 18, 700));
  Work work = comm_->allreduce(x, ReduceOp::max, {.label = "progress"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!work.test() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(work.test());
  work.wait();
  std::vector<double> expected;
  for (std::int64_t i = 0; i < x.numel(); ++i)
    expected.push_back(reduced(ReduceOp::max, DType::f32, comm_->size(), i, 700));
  expect_values(values_of(x), expected, DType::f32, true, "progress");
}

// A barrier completes only when every rank has reached it: rank 0 arrives late.
TEST_P(Collectives, BarrierWaitsForTheLastRank) {
  comm_->barrier({.label = "align"}).wait();
  const auto start = std::chrono::steady_clock::now();
  if (comm_->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  comm_->barrier({.label = "late rank 0"}).wait();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.15) << "rank " << comm_->rank() << " left the barrier before rank 0 arrived";
}

// GPU tensors on a stream of the caller's: the collective starts after the work issued to
// that stream (here the copy of the input), and wait(stream) orders later work on it (here
// the copy back), without blocking the host in between. (On the CPU the stream is the no-op
// CPU stream and wait(stream) waits on the host.)
TEST_P(Collectives, OrderedOnTheCallersStream) {
  const Stream stream = Stream::create(device_);
  const int r = comm_->rank(), w = comm_->size();
  const std::int64_t n = (1 << 20) + 3;
  const Tensor in = make_input(DType::f32, r, n, 800).to(device_, stream);
  Work work = comm_->allreduce(in, ReduceOp::sum, {.label = "on a stream", .stream = stream});
  work.wait(stream);
  const Tensor back = in.to(Device::cpu(), stream);
  stream.synchronize();
  std::vector<double> expected;
  for (std::int64_t i = 0; i < n; ++i) expected.push_back(reduced(ReduceOp::sum, DType::f32, w, i, 800));
  expect_values(values_of(back), expected, DType::f32, false, "allreduce on the caller's stream");
  work.wait();
}

INSTANTIATE_TEST_SUITE_P(Comm, Collectives, ::testing::Values("cpu", "gpu", "gpu_staging"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tutti::testing
