#include "sync.h"

#include <cstdio>
#include <string>
#include <vector>

namespace example {

namespace {

// "ddp" -> 0; "diloco:H" -> H (>= 1); InvalidArgument naming --sync otherwise.
int parse_sync(const std::string& text) {
  if (text == "ddp") return 0;
  const std::string prefix = "diloco:";
  TUTTI_CHECK_ARG(text.rfind(prefix, 0) == 0 && text.size() > prefix.size(), "--sync: '", text,
                  "' is not ddp or diloco:H (H: inner steps between outer syncs, e.g. diloco:50)");
  const std::string h = text.substr(prefix.size());
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(h, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TUTTI_CHECK_ARG(used == h.size() && used > 0, "--sync: '", text, "': H must be a whole number, not '", h, "'");
  TUTTI_CHECK_ARG(value >= 1 && value <= 1000000000, "--sync: '", text,
                  "': H (inner steps between outer syncs) must be at least 1");
  return static_cast<int>(value);
}

}  // namespace

Sync::Sync(tutti::Job& job, const RunFlags& f, int tensor_parallel)
    : job_(job), f_(f), sync_every_(parse_sync(f.sync)) {
  job.check_same("--sync", f.sync);
  job.check_same("--ranks-per-node", std::to_string(f.ranks_per_node));
  const int world = job.world_size(), tp = tensor_parallel;
  TUTTI_CHECK_ARG(tp >= 1 && world % tp == 0, "--tp ", tp, " must divide the ", world, " rank(s)");
  // The meshes below are row-major with tp last: the ranks of one tp group are consecutive, and
  // each group is one data-parallel replica.
  data_rank_ = job.rank() / tp;
  data_size_ = world / tp;
  mode_ = diloco() ? "diloco:" + std::to_string(sync_every_) : "ddp";
  if (!diloco()) {
    TUTTI_CHECK_ARG(f.streaming == 1, "--streaming applies to --sync diloco:H");
    TUTTI_CHECK_ARG(f.overlap == 0, "--overlap applies to --sync diloco:H");
    if (tp > 1) {
      // PowerSGD compresses each rank's slices over its data-parallel group; its state is saved
      // per tp rank (train::State::tensor_parallel).
      job.check_same("--allreduce", f.allreduce + " --powersgd-start " + std::to_string(f.powersgd_start));
      TUTTI_CHECK_ARG(f.allreduce == "flat" || powersgd_rank(f.allreduce) > 0,
                      "--tp: data parallelism over the tp groups is --allreduce flat or powersgd:R, got --allreduce ",
                      f.allreduce);
      mesh_.emplace(job.mesh({{"dp", data_size_}, {"tp", tp}}));
      return;
    }
    example::ddp_communicator(job, f, hierarchical_);
    return;
  }
  job.check_same(
      "--outer-lr, --outer-momentum, --outer-dtype, --error-feedback, --streaming, --overlap, "
      "--outer-exchange",
      std::to_string(f.outer_lr) + " " + std::to_string(f.outer_momentum) + " " + f.outer_dtype + " " +
          std::to_string(f.error_feedback) + " " + std::to_string(f.streaming) + " " + std::to_string(f.overlap) + " " +
          f.outer_exchange);
  TUTTI_CHECK_ARG(f.allreduce == "flat", "--allreduce ", f.allreduce,
                  " applies to --sync ddp; --sync diloco already reduces inside the node and "
                  "syncs across nodes");
  TUTTI_CHECK_ARG(!f.deterministic,
                  "--deterministic applies to --sync ddp (a model independent of the number of ranks); --sync diloco "
                  "depends on the node layout by design");
  // The outer optimizer's values and the node layout (two nodes at least, of equal sizes) are
  // checked by DiLoCo's constructor in start(), whose errors name the flags.
  groups_ = job.node_groups({}, f.ranks_per_node);
  if (tp > 1) use_tensor_parallel_mesh(tp);
}

void Sync::use_tensor_parallel_mesh(int tp) {
  // Each node's ranks as dp x tp: its tp groups inside it. That needs nodes of one size that tp
  // divides, their ranks consecutive (mpirun's placement by slot; --ranks-per-node's blocks).
  const int nodes = groups_.node_count(), per_node = groups_.node_sizes.front();
  bool equal = true;
  for (const int size : groups_.node_sizes) equal = equal && size == per_node;
  TUTTI_CHECK_ARG(equal && per_node % tp == 0, "--tp ", tp,
                  " with --sync diloco: every node's ranks must divide by --tp",
                  " (its tp groups stay inside it); the nodes hold ", groups_.sizes_str(), " rank(s)");
  const int rank = job_.rank();
  const bool consecutive = groups_.node == rank / per_node && groups_.intra->rank() == rank % per_node;
  job_.check_same("--tp with --sync diloco: each node's ranks consecutive",
                  consecutive ? std::string("yes")
                              : "rank " + std::to_string(rank) + " on node " + std::to_string(groups_.node) +
                                    " as local rank " + std::to_string(groups_.intra->rank()));
  mesh_.emplace(job_.mesh({{"node", nodes}, {"dp", per_node / tp}, {"tp", tp}}));
  // DDP inside the node over the ranks of this tp coordinate; DiLoCo across the nodes over the
  // ranks of this (dp, tp) coordinate.
  groups_ = tutti::NodeGroups{.intra = mesh_->group_ptr("dp"),
                              .inter = mesh_->group_ptr("node"),
                              .node = mesh_->coordinate("node"),
                              .node_sizes = std::vector<int>(static_cast<std::size_t>(nodes), per_node / tp)};
}

tutti::Communicator& Sync::ddp_communicator() {
  if (diloco()) return *groups_.intra;
  if (mesh_) return mesh_->group("dp");
  return hierarchical_ ? *hierarchical_ : job_.communicator();
}

void Sync::start(tutti::ddp::DistributedDataParallel& ddp, tutti::optim::Optimizer& optimizer) {
  if (!diloco()) return;
  tutti::ddp::DiLoCoOptions o;
  o.sync_every = sync_every_;
  o.outer_lr = f_.outer_lr;
  o.outer_momentum = f_.outer_momentum;
  o.outer_dtype = tutti::ddp::parse_outer_dtype(f_.outer_dtype);
  o.error_feedback = f_.error_feedback;
  o.fragments = f_.streaming;
  o.overlap_steps = f_.overlap;
  o.exchange = tutti::ddp::parse_outer_exchange(f_.outer_exchange);
  diloco_ = std::make_unique<tutti::ddp::DiLoCo>(ddp, optimizer, groups_, o);
}

void Sync::add_state(tutti::train::State& state) {
  if (diloco_) {
    state.add_collective("diloco.", *diloco_);
    return;
  }
  state.add(
      "diloco.", [] { return tutti::StateDict(); },
      [](const tutti::StateDict& saved) {
        TUTTI_CHECK_ARG(saved.empty(),
                        "the checkpoint was written with --sync diloco (it holds DiLoCo's outer state): resume it "
                        "with --sync diloco:H, or start afresh");
      });
}

bool Sync::end_step(const tutti::train::Run& run) {
  return diloco_ && diloco_->end_inner_step(/*last_step=*/run.step() + 1 == run.steps());
}

std::string Sync::describe() const {
  if (!diloco()) return mode_;
  char text[256];
  std::string streaming = f_.streaming > 1 ? ", streaming " + std::to_string(f_.streaming) + " fragments" : "";
  if (f_.overlap > 0) streaming += ", overlap " + std::to_string(f_.overlap) + " steps";
  if (f_.outer_exchange != "auto") streaming += ", " + f_.outer_exchange;
  const std::string tp = mesh_ ? " x tp " + std::to_string(mesh_->size("tp")) : "";
  std::snprintf(text, sizeof text, "%s (outer %s lr %g momentum %g, %s%s%s; %d nodes x %d%s)", mode_.c_str(),
                "Nesterov", f_.outer_lr, f_.outer_momentum, f_.outer_dtype.c_str(),
                f_.error_feedback ? ", error feedback" : "", streaming.c_str(), groups_.node_count(),
                groups_.node_sizes.front(), tp.c_str());
  return text;
}

}  // namespace example
