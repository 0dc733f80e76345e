// Multi-node tests: run by multinode_test.py on the emulated cluster (scripts/cluster.sh), under
// mpirun across CLUSTER_TEST_NODES nodes with CLUSTER_TEST_RANKS_PER_NODE ranks each, placed by
// slot (ranks 0..k-1 on node0, the next k on node1, ...). Outside such a run every test skips,
// and the driver fails a run in which any test skipped.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ddp/ddp_test_util.h"
#include "tutti/ddp/ddp.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"

namespace tutti::testing {
namespace {

struct Layout {
  int nodes = 0, per_node = 0;
};

Layout expected_layout() {
  const char* n = std::getenv("CLUSTER_TEST_NODES");
  const char* k = std::getenv("CLUSTER_TEST_RANKS_PER_NODE");
  if (n == nullptr || k == nullptr) return {};
  return {std::atoi(n), std::atoi(k)};
}

#define REQUIRE_CLUSTER(layout)            \
  const Layout layout = expected_layout(); \
  if (layout.nodes == 0) GTEST_SKIP() << "not on the emulated cluster (run by multinode_test.py)"

// Every rank's host name, gathered over MPI (independently of the Job's own bookkeeping).
std::vector<std::string> all_hostnames() {
  char mine[64] = {0};
  gethostname(mine, sizeof mine - 1);
  std::vector<char> all(64 * static_cast<std::size_t>(world().world_size()));
  MPI_Allgather(mine, 64, MPI_CHAR, all.data(), 64, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> out;
  for (int r = 0; r < world().world_size(); ++r) out.emplace_back(all.data() + 64 * r);
  return out;
}

TEST(MultiNode, JobKnowsRankLocalRankLocalSizeAndNodeCount) {
  REQUIRE_CLUSTER(layout);
  Job& job = world();
  ASSERT_EQ(job.world_size(), layout.nodes * layout.per_node);
  EXPECT_EQ(job.node_count(), layout.nodes);
  EXPECT_EQ(job.local_size(), layout.per_node);
  EXPECT_EQ(job.local_rank(), job.rank() % layout.per_node);
  // The hosts are really distinct: node<i> for rank i*k .. i*k+k-1, as the hostfile places them.
  const std::vector<std::string> hosts = all_hostnames();
  EXPECT_EQ(std::set<std::string>(hosts.begin(), hosts.end()).size(), static_cast<std::size_t>(layout.nodes));
  EXPECT_EQ(job.hostname(), "node" + std::to_string(job.rank() / layout.per_node));
  EXPECT_EQ(hosts[static_cast<std::size_t>(job.rank())], job.hostname());
  // The summary counts the hosts too.
  const std::string summary = job.summary();
  EXPECT_NE(summary.find(" on " + std::to_string(layout.nodes) + " host(s)"), std::string::npos) << summary;
}

TEST(MultiNode, CollectivesAcrossNodesAreExact) {
  REQUIRE_CLUSTER(layout);
  // Sizes below and far above Open MPI's eager limit over TCP (64 KiB), an odd count.
  for (std::int64_t n : {1, 1000, 262147}) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>((i % 5) + world().rank());
    Tensor t = Tensor::from_floats(v, {n});
    world().communicator().allreduce(t).wait();
    const std::vector<float> got = t.to_floats();
    const int w = world().world_size();
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(w * (i % 5) + w * (w - 1) / 2);
      wrong += got[static_cast<std::size_t>(i)] != want;
    }
    EXPECT_EQ(wrong, 0) << n << " elements";
  }
}

// DDP across the nodes against one process training the whole batch (as tests/ddp/ddp_test.cc).
double ddp_against_one_rank(const std::function<std::unique_ptr<nn::Sequential>()>& make, const Shape& input_shape,
                            Opt opt_kind, int accumulation, ddp::DdpOptions options) {
  auto reference = make();
  reference->init(kSeed);
  auto distributed = make();
  distributed->init(world().rank() == 0 ? kSeed : kSeed + 17);  // DDP must broadcast rank 0's
  auto ref_opt = make_optimizer(opt_kind, *reference);
  ddp::DistributedDataParallel ddp(world().communicator(), *distributed, options);
  auto ddp_opt = make_optimizer(opt_kind, *distributed);
  nn::CrossEntropyLoss loss;
  const std::int64_t micro = 4 * world().world_size();
  for (int step = 0; step < 3; ++step) {
    const Batch big = global_batch(input_shape, micro * accumulation, 200 + static_cast<std::uint32_t>(step));
    reference->zero_grad();
    loss.forward(reference->forward(big.x), big.y);
    reference->backward(loss.grad());
    ref_opt->step();
    for (int m = 0; m < accumulation; ++m) {
      const Batch mb = my_slice(rows(big, m * micro, micro));
      loss.forward(ddp.forward(mb.x), mb.y);
      if (ddp.backward(loss.grad())) {
        ddp_opt->step();
        ddp.zero_grad();
      }
    }
  }
  auto untouched = make();
  untouched->init(kSeed);
  EXPECT_GT(relative_difference(*untouched, *reference), 1e-3) << "the steps changed nothing";
  return relative_difference(*distributed, *reference);
}

TEST(MultiNode, DdpEqualsOneRankWithTheWholeBatch) {
  REQUIRE_CLUSTER(layout);
  ddp::DdpOptions small_buckets;
  small_buckets.bucket_cap_mb = 0.001;  // several buckets, so several allreduces cross the nodes
  small_buckets.first_bucket_cap_mb = 0.0005;
  EXPECT_LE(ddp_against_one_rank([] { return make_mlp(64); }, {12}, Opt::sgd, 1, small_buckets), 1e-5);
  ddp::DdpOptions accumulate;
  accumulate.accumulation_steps = 2;
  EXPECT_LE(ddp_against_one_rank([] { return make_mlp(32); }, {12}, Opt::adamw, 2, accumulate), 1e-5);
}

}  // namespace
}  // namespace tutti::testing

int main(int argc, char** argv) { return tutti::testing::run_world_tests(argc, argv); }
