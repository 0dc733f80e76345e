// Job::node_groups and the hierarchical allreduce under mpiexec (1 to 4 ranks; on the
// emulated device over nccl, also at np 4: comm_test_emu_groups.np4): the real node map's
// groups; a faked map of nodes of 2 ranks, whose groups hold the ranks it says and whose
// hierarchical allreduce equals the flat one (integers exactly, floats within rounding); at 3
// ranks (nodes of 2 and 1) the hierarchical allreduce is refused, naming the node sizes, while
// the groups themselves work. Job::mesh: dp x tp (tp 2 where the ranks are even) holds the
// ranks of its layout; ranks that pass different meshes get an error, not a wait.
#include "comm/comm_test_util.h"
#include "tutti/comm/groups.h"
#include "tutti/comm/mesh.h"

namespace tutti::testing {
namespace {

// The sum of the world ranks of a group's members, allreduced on `comm` (on the job's device).
std::int64_t sum_of_ranks(Communicator& comm) {
  const Tensor x = Tensor::from_ints({job().rank()}, {1}, DType::i64).to(job().device());
  comm.allreduce(x, ReduceOp::sum, {.label = "members"}).wait();
  return x.to(Device::cpu()).to_ints()[0];
}

TEST(CommNodeGroups, RealNodeMap) {
  Job& j = job();
  NodeGroups g = j.node_groups();
  EXPECT_EQ(g.node_count(), j.node_count());
  EXPECT_EQ(g.node_sizes[static_cast<std::size_t>(g.node)], j.local_size());
  EXPECT_EQ(g.intra->size(), j.local_size());
  EXPECT_EQ(g.intra->rank(), j.local_rank());
  EXPECT_EQ(g.inter->size(), j.node_count());
  EXPECT_EQ(g.intra->backend(), j.backend());
  // One host (ctest): the node is every rank; across nodes, each rank alone.
  if (j.node_count() == 1) {
    EXPECT_EQ(sum_of_ranks(*g.intra), j.world_size() * (j.world_size() - 1) / 2);
    EXPECT_EQ(sum_of_ranks(*g.inter), j.rank());
  }
}

TEST(CommNodeGroups, FakedNodesOfTwo) {
  Job& j = job();
  const int n = j.world_size(), r = j.rank();
  NodeGroups g = j.node_groups({}, 2);
  EXPECT_EQ(g.node, r / 2);
  EXPECT_EQ(g.node_count(), (n + 1) / 2);
  EXPECT_EQ(g.intra->rank(), r % 2);
  EXPECT_EQ(g.inter->rank(), r / 2);
  const int partner = (r ^ 1) < n ? (r ^ 1) : r;
  EXPECT_EQ(sum_of_ranks(*g.intra), partner == r ? r : r + partner);
  std::int64_t same_local = 0;
  for (int q = r % 2; q < n; q += 2) same_local += q;
  EXPECT_EQ(sum_of_ranks(*g.inter), same_local);

  if (n % 2 == 1 && n > 1) {
    try {
      (void)hierarchical_communicator(j.communicator(), g);
      ADD_FAILURE() << "unequal nodes accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("has 2, 1 rank(s) on its 2 nodes"), std::string::npos) << e.what();
    }
    return;
  }
  auto hier = hierarchical_communicator(j.communicator(), g);
  EXPECT_EQ(hier->backend(), "hierarchical(" + std::string(j.backend()) + ")");
  const Device device = j.device();
  std::uint32_t seed = 900;
  for (DType dtype : {DType::f32, DType::i64}) {
    for (std::int64_t count : {std::int64_t{1}, std::int64_t{100003}}) {
      const Tensor flat = make_input(dtype, r, count, seed).to(device);
      const Tensor mine = make_input(dtype, r, count, seed).to(device);
      ++seed;
      j.communicator().allreduce(flat, ReduceOp::sum, {.label = "flat"}).wait();
      hier->allreduce(mine, ReduceOp::sum, {.label = "hierarchical"}).wait();
      expect_values(values_of(mine.to(Device::cpu())), values_of(flat.to(Device::cpu())), dtype,
                    /*exact=*/!is_floating(dtype), std::string("hierarchical ") + std::string(name_of(dtype)));
    }
  }
}

TEST(CommMesh, GroupsOfTheJob) {
  Job& j = job();
  const int n = j.world_size(), r = j.rank();
  const int tp = n % 2 == 0 ? 2 : 1;
  DeviceMesh mesh = j.mesh({{"dp", kMeshRest}, {"tp", tp}});
  EXPECT_EQ(mesh.size("dp"), n / tp);
  EXPECT_EQ(mesh.coordinate("dp"), r / tp);
  EXPECT_EQ(mesh.coordinate("tp"), r % tp);
  EXPECT_EQ(mesh.group("tp").backend(), j.backend());
  EXPECT_EQ(mesh.group("tp").rank(), r % tp);
  EXPECT_EQ(mesh.group("dp").rank(), r / tp);
  // tp: the block of tp consecutive ranks; dp: the ranks with the same remainder.
  const int first = r - r % tp;
  EXPECT_EQ(sum_of_ranks(mesh.group("tp")), tp == 2 ? 2 * first + 1 : r);
  std::int64_t same_tp = 0;
  for (int q = r % tp; q < n; q += tp) same_tp += q;
  EXPECT_EQ(sum_of_ranks(mesh.group("dp")), same_tp);
}

TEST(CommMesh, RanksThatDisagreeAreToldInsteadOfWaiting) {
  Job& j = job();
  if (j.world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  try {
    (void)j.mesh({{j.rank() == 0 ? "dp" : "tp", kMeshRest}});
    ADD_FAILURE() << "different meshes accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'dp -1' on rank 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tutti::testing
