// Node groups and the hierarchical allreduce on thread ranks with faked node maps: the groups
// hold the ranks the node map says; the hierarchical allreduce equals the flat one (integers
// exactly, floats within rounding) at 2 x 2 and 3 x 2, in place and not, with a tail that does
// not divide by the node size, and in pipelined segments; unequal nodes are refused naming
// their sizes.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/comm_test_util.h"
#include "tutti/comm/groups.h"
#include "tutti/comm/thread_group.h"

namespace tutti {
namespace {

using testing::make_input;
using testing::values_of;

TEST(NodeGroups, HoldTheRanksOfTheNodeMap) {
  const std::vector<int> sizes = {2, 2, 2};
  ThreadGroup group(6);
  group.run([&](int r) {
    NodeGroups g = group.node_groups(r, sizes);
    EXPECT_EQ(g.node, r / 2);
    EXPECT_EQ(g.node_count(), 3);
    EXPECT_EQ(g.intra->size(), 2);
    EXPECT_EQ(g.intra->rank(), r % 2);
    EXPECT_EQ(g.inter->size(), 3);
    EXPECT_EQ(g.inter->rank(), r / 2);
    // The sum of the members' world ranks names the members.
    const Tensor a = Tensor::from_ints({r}, {1}, DType::i64);
    const Tensor b = Tensor::from_ints({r}, {1}, DType::i64);
    g.intra->allreduce(a).wait();
    g.inter->allreduce(b).wait();
    EXPECT_EQ(a.to_ints()[0], (r / 2) * 4 + 1);  // 2k + 2k+1
    EXPECT_EQ(b.to_ints()[0], 3 * (r % 2) + 6);  // l + (2 + l) + (4 + l)
  });
}

TEST(NodeGroups, UnequalNodesHaveGroupsButNoHierarchicalAllreduce) {
  ThreadGroup group(4);
  group.run([&](int r) {
    NodeGroups g = group.node_groups(r, {3, 1});
    EXPECT_EQ(g.intra->size(), r < 3 ? 3 : 1);
    EXPECT_EQ(g.inter->size(), r % 3 == 0 ? 2 : 1);  // local index 0 exists on both nodes
    try {
      (void)hierarchical_communicator(group.communicator(r), g);
      ADD_FAILURE() << "unequal nodes accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("has 3, 1 rank(s) on its 2 nodes"), std::string::npos) << e.what();
    }
  });
}

// The hierarchical allreduce of every dtype and op against the flat one, nodes x local ranks.
void expect_equal_to_flat(int nodes, int local, std::int64_t n) {
  ThreadGroup group(nodes * local);
  group.run([&](int r) {
    Communicator& world = group.communicator(r);
    auto hier = hierarchical_communicator(world, group.node_groups(r, std::vector<int>(nodes, local)));
    EXPECT_EQ(hier->size(), nodes * local);
    EXPECT_EQ(hier->backend(), "hierarchical(thread)");
    std::uint32_t seed = 1;
    for (DType dtype : {DType::f32, DType::i32, DType::i64}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        if (op == ReduceOp::avg && !is_floating(dtype)) continue;
        const Tensor flat = make_input(dtype, r, n, seed);
        const Tensor in = make_input(dtype, r, n, seed);
        const Tensor in_place = make_input(dtype, r, n, seed);
        const Tensor out = Tensor::zeros({n}, dtype);
        ++seed;
        world.allreduce(flat, op).wait();
        Work a = hier->allreduce(in, out, op);
        Work b = hier->allreduce(in_place, op);  // two in flight: completed in issue order
        b.wait();
        a.wait();
        const std::vector<double> want = values_of(flat), got = values_of(out), got2 = values_of(in_place);
        for (std::int64_t i = 0; i < n; ++i) {
          const auto k = static_cast<std::size_t>(i);
          if (is_floating(dtype)) {
            EXPECT_NEAR(got[k], want[k], 1e-5 * (1 + std::abs(want[k]))) << name_of(dtype) << " " << name_of(op);
          } else {
            EXPECT_EQ(got[k], want[k]) << name_of(dtype) << " " << name_of(op) << " element " << i;
          }
          EXPECT_EQ(got2[k], got[k]);
        }
        EXPECT_EQ(values_of(in), values_of(make_input(dtype, r, n, seed - 1)));  // out of place: input kept
      }
    }
    // The other collectives are the world's.
    const Tensor x = Tensor::from_floats({static_cast<float>(r)}, {1});
    hier->broadcast(x, 1).wait();
    EXPECT_EQ(x.to_floats()[0], 1.0f);
  });
}

TEST(HierarchicalAllreduce, EqualsFlatOnTwoNodesOfTwo) { expect_equal_to_flat(2, 2, 1001); }
TEST(HierarchicalAllreduce, EqualsFlatOnThreeNodesOfTwo) { expect_equal_to_flat(3, 2, 1000); }
// Above 2 MiB the body goes in pipelined segments (2 for f32 here, 4 for i64).
TEST(HierarchicalAllreduce, EqualsFlatInSegments) { expect_equal_to_flat(2, 2, (1 << 19) + 3); }
TEST(HierarchicalAllreduce, EqualsFlatWithTheTailOnly) { expect_equal_to_flat(2, 3, 2); }
TEST(HierarchicalAllreduce, OneNodeForwardsToTheWorld) { expect_equal_to_flat(1, 3, 10); }

}  // namespace
}  // namespace tutti
