// Communicator::sendrecv under mpirun, on the three targets of the other collectives' tests:
// CPU tensors (mpi), GPU tensors on the job's communicator (nccl where each rank has a GPU of
// its own) and GPU tensors staged through the host (mpi). Each rank's output is checked against
// the input its peer computes (every rank can recompute every rank's input). On the CPU also:
// counts that differ, agreed on above 1 KiB (a mismatch on every rank, the peers not compared)
// and checked on receipt below it.
#include "comm/comm_test_util.h"
#include "tutti/comm/communicator.h"

namespace tutti::testing {
namespace {

const DType kAllDtypes[] = {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64};

class Sendrecv : public DataPathTest {
 protected:
  // Sends this rank's input of test case `seed` to `to`, receives from `from`: the output is
  // `from`'s input, bit for bit, and the input is kept.
  void check(DType dtype, std::int64_t n, int to, int from, std::uint32_t seed, const std::string& what) {
    const int r = comm_->rank();
    const Tensor in = make_input(dtype, r, n, seed).to(device_);
    const Tensor out = Tensor::zeros({n}, dtype, device_);
    const std::string label = what + " " + std::string(name_of(dtype)) + " n=" + std::to_string(n);
    Work work = comm_->sendrecv(in, out, to, from, {.label = label});
    work.wait();
    EXPECT_EQ(work.info().kind, CollectiveKind::sendrecv);
    expect_values(values_of(out), values_of(make_input(dtype, from, n, seed)), dtype, true,
                  label + " on rank " + std::to_string(r));
    expect_values(values_of(in), values_of(make_input(dtype, r, n, seed)), dtype, true, label + " (input kept)");
  }
};

TEST_P(Sendrecv, RotationsEveryDtypeAndSize) {
  const int r = comm_->rank(), w = comm_->size();
  std::uint32_t seed = 1100;
  for (DType dtype : kAllDtypes) {
    for (std::int64_t n : {0, 1, 7, 1001}) {
      check(dtype, n, (r + 1) % w, (r + w - 1) % w, ++seed, "rotation");
      check(dtype, n, (r + w - 1) % w, (r + 1) % w, ++seed, "back rotation");
    }
  }
  // Several MB (above every eager limit).
  check(DType::f32, (std::int64_t{1} << 20) + 3, (r + 1) % w, (r + w - 1) % w, ++seed, "rotation 4 MiB");
}

// Pairs (0, 1), (2, 3); the last rank of an odd world exchanges with itself.
TEST_P(Sendrecv, SwapsAndSelf) {
  const int r = comm_->rank(), w = comm_->size();
  const int partner = (r ^ 1) < w ? (r ^ 1) : r;
  std::uint32_t seed = 1200;
  for (std::int64_t n : {1, 1001}) {
    check(DType::bf16, n, partner, partner, ++seed, "swap");
    check(DType::i64, n, r, r, ++seed, "self");
  }
}

// Several in flight at once, between allreduces, waited for in reverse: each is right, and
// they complete in issue order.
TEST_P(Sendrecv, InFlightWithOtherCollectives) {
  const int r = comm_->rank(), w = comm_->size();
  std::vector<Work> works;
  std::vector<Tensor> outs;
  const std::int64_t n = 333;
  for (int k = 0; k < 6; ++k) {
    const auto seed = static_cast<std::uint32_t>(1300 + k);
    outs.push_back(Tensor::zeros({n}, DType::f32, device_));
    works.push_back(
        comm_->sendrecv(make_input(DType::f32, r, n, seed).to(device_), outs.back(), (r + k) % w, (r + w - k % w) % w));
    works.push_back(comm_->allreduce(Tensor::zeros({8}, DType::f32, device_)));
  }
  for (std::size_t k = works.size(); k-- > 0;) {
    works[k].wait();
    for (std::size_t j = 0; j < k; ++j) EXPECT_TRUE(works[j].test()) << j << " before " << k;
  }
  for (int k = 0; k < 6; ++k) {
    const auto seed = static_cast<std::uint32_t>(1300 + k);
    expect_values(values_of(outs[static_cast<std::size_t>(k)]),
                  values_of(make_input(DType::f32, (r + w - k % w) % w, n, seed)), DType::f32, true,
                  "in flight #" + std::to_string(k));
  }
}

INSTANTIATE_TEST_SUITE_P(Comm, Sendrecv, ::testing::Values("cpu", "gpu", "gpu_staging"),
                         [](const auto& info) { return info.param; });

// Above 1 KiB the mpi backend agrees on the count before moving data: a rotation (peers differ
// on every rank) passes it; a count that differs on rank 1 fails on every rank naming both
// calls, and the communicator goes on.
TEST(SendrecvAgreement, LargeCountsAreAgreedOnButNotThePeers) {
  if (job().world_size() < 2) GTEST_SKIP() << "a mismatch needs two ranks";
  Communicator& comm = job().cpu_communicator();
  ASSERT_FALSE(comm.debug());
  const int r = comm.rank(), w = comm.size();
  const std::int64_t n = r == 1 ? 5000 : 4096;
  const Work work = comm.sendrecv(Tensor::zeros({n}, DType::f32), Tensor::zeros({n}, DType::f32), (r + 1) % w,
                                  (r + w - 1) % w, {.label = "counts differ"});
  const std::string seq = "#" + std::to_string(work.info().seq);
  expect_mismatch(work, {"collective mismatch: rank 0 issued " + seq +
                             " sendrecv 4096 x f32 (16.0 KiB) but rank 1 issued " + seq + " sendrecv 5000 x f32",
                         "on backend mpi"});
  const Tensor in = make_input(DType::f32, r, 3000, 1400), out = Tensor::zeros({3000}, DType::f32);
  comm.sendrecv(in, out, (r + 1) % w, (r + w - 1) % w).wait();
  expect_values(values_of(out), values_of(make_input(DType::f32, (r + w - 1) % w, 3000, 1400)), DType::f32, true,
                "after an agreed mismatch");
}

// Below 1 KiB nothing is agreed on: a rank that receives fewer elements than its output holds
// fails naming the sender (a longer message fails in MPI: MPI_ERR_TRUNCATE). Rank 0 passes 3
// elements, the others 5, in a rotation: rank 1 receives 3, rank 0 receives 5.
TEST(SendrecvAgreement, SmallCountsAreCheckedOnReceipt) {
  if (job().world_size() < 2) GTEST_SKIP() << "a mismatch needs two ranks";
  Communicator& comm = job().cpu_communicator();
  const int r = comm.rank(), w = comm.size();
  const std::int64_t n = r == 0 ? 3 : 5;
  const Work work =
      comm.sendrecv(Tensor::zeros({n}, DType::i32), Tensor::zeros({n}, DType::i32), (r + 1) % w, (r + w - 1) % w);
  std::string error;
  try {
    work.wait();
  } catch (const Error& e) {
    error = e.what();
  }
  if (r == 1) {
    EXPECT_NE(error.find("sendrecv: rank 1 received 3 elements from rank 0 but expected 5"), std::string::npos)
        << error;
  } else if (r == 0) {
    EXPECT_FALSE(error.empty()) << "rank 0 received 5 elements into 3";
  } else {
    EXPECT_TRUE(error.empty()) << error;
  }
  // The communicator goes on.
  comm.barrier().wait();
  const Tensor in = make_input(DType::i32, r, 4, 1500), out = Tensor::zeros({4}, DType::i32);
  comm.sendrecv(in, out, (r + 1) % w, (r + w - 1) % w).wait();
  expect_values(values_of(out), values_of(make_input(DType::i32, (r + w - 1) % w, 4, 1500)), DType::i32, true,
                "after a short message");
}

}  // namespace
}  // namespace tutti::testing
