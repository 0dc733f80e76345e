// train::Run's side of the memory snapshots (train/snapshots.h): where the ranks' nodes and
// folders are, the run id that ties a snapshot to its run, and the state as parts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "io/checkpoint_file.h"
#include "parallel/split_owner.h"
#include "train/run_impl.h"
#include "tutti/amp/loss_scaler.h"
#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"
#include "tutti/nn/module.h"

namespace tutti::train {
namespace {

namespace fs = std::filesystem;

detail::MemorySnapshots::Piece whole(const Tensor& t) { return {t.view(0, {t.numel()}), 0, t.shape()}; }

// The split parameter whose state `key` is, when the entry has that parameter's (slice's) shape.
const nn::Parameter* split_owner(const std::vector<nn::Parameter*>& params, const std::string& key,
                                 const Shape& shape) {
  const nn::Parameter* p = parallel::split_owner(params, key);
  return p != nullptr && p->shape() == shape ? p : nullptr;
}

// `parts` (this rank's parts of its state) with every split parameter's tensor put as row r of
// a [tp, slice...] tensor, r this rank's place in the group: the group's parts then fill it,
// and tp ranks' parts never collide (a part of a replicated tensor is the same on every tp rank).
void add_parts(std::map<std::string, detail::MemorySnapshots::Piece>& into, const std::string& prefix,
               const ddp::StateParts& parts, const std::vector<nn::Parameter*>& params, const Communicator* tp) {
  for (const auto& [key, p] : parts) {
    detail::MemorySnapshots::Piece piece{p.part, p.begin, p.shape};
    if (tp != nullptr && split_owner(params, key, p.shape) != nullptr) {
      piece.begin += tp->rank() * numel_of(p.shape);
      piece.shape.insert(piece.shape.begin(), tp->size());
    }
    into[prefix + key] = piece;
  }
}

void add_whole(std::map<std::string, detail::MemorySnapshots::Piece>& into, const std::string& prefix,
               const StateDict& state) {
  for (const auto& [key, t] : state) into[prefix + key] = whole(t);
}

}  // namespace

std::int64_t detail::auto_snapshot_interval(double snapshot_seconds, double step_seconds, double cost, double mtbf) {
  const double step = std::max(step_seconds, 1e-9);
  const double k = mtbf > 0 ? std::round(std::sqrt(2 * snapshot_seconds * mtbf) / step)
                            : std::ceil(snapshot_seconds / (cost * step));
  return static_cast<std::int64_t>(std::clamp(k, 1.0, 1e9));
}

std::vector<int> Run::Impl::snapshot_nodes() const {
  std::vector<int> nodes;
  if (!hostname.empty()) {
    // With a Job: ranks with the same host name share a node (COLLECTIVE).
    const Tensor mine = Tensor::from_ints({crc_of(hostname)}, {1}, DType::i64);
    const Tensor all = Tensor::empty({world}, DType::i64);
    CallOptions call;
    call.label = "memory snapshot nodes";
    cpu_comm->allgather(mine, all, call).wait();
    std::vector<std::int64_t> hashes = all.to_ints();
    for (const std::int64_t h : hashes) {
      nodes.push_back(static_cast<int>(std::find(hashes.begin(), hashes.end(), h) - hashes.begin()));
    }
    return nodes;
  }
  if (!options.snapshots.nodes.empty()) return options.snapshots.nodes;
  nodes.resize(static_cast<std::size_t>(world));
  std::iota(nodes.begin(), nodes.end(), 0);
  return nodes;
}

std::string Run::Impl::node_dir() const {
  const std::string base = options.snapshots.dir.empty() ? "/dev/shm" : options.snapshots.dir;
  if (!hostname.empty()) return base;
  return base + "/node" + std::to_string(nodes[static_cast<std::size_t>(rank)]);
}

std::string Run::Impl::read_run_id() const {
  const std::string file = options.checkpoint_dir + "/run-id";
  std::string id;
  std::ifstream in(file);
  if (in) std::getline(in, id);
  check_same("the run id in " + file + " (is --checkpoint-dir shared?)", id);
  return id;
}

std::string Run::Impl::new_run_id(const std::string& old) {
  std::int64_t value = 0;
  if (rank == 0) {
    std::random_device random;
    value = (static_cast<std::int64_t>(random()) << 32 | random()) & 0x7fffffffffffffff;
  }
  const Tensor t = Tensor::from_ints({value}, {1}, DType::i64);
  CallOptions call;
  call.label = "run id";
  cpu_comm->broadcast(t, 0, call).wait();
  char text[24];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(t.to_ints()[0]));
  const std::string id = text;
  if (rank == 0) {
    fs::create_directories(options.checkpoint_dir);
    const std::string line = id + "\n";
    io::detail::write_file_atomically(options.checkpoint_dir + "/run-id", line.data(), line.size());
  }
  // An earlier run's snapshots in this node's memory are nobody's now.
  if (!old.empty()) {
    std::error_code ignored;
    fs::remove_all(node_dir() + "/tutti-" + old, ignored);
  }
  return id;
}

std::unique_ptr<detail::MemorySnapshots> Run::Impl::make_snapshots(const std::string& run_id) const {
  detail::SnapshotPlace place;
  place.comm = cpu_comm;
  place.rank = rank;
  place.world = world;
  place.node_of_rank = nodes;
  place.node_dir = node_dir();
  place.run_id = run_id;
  place.free_bytes = hooks.snapshot_free_bytes;
  return std::make_unique<detail::MemorySnapshots>(std::move(place));
}

StateDict Run::Impl::snapshot_part() const {
  ddp::DistributedDataParallel& ddp = *state.ddp;
  std::map<std::string, detail::MemorySnapshots::Piece> pieces;
  const std::vector<nn::Parameter*> params = ddp.module().parameters();
  add_parts(pieces, "model.", ddp.state().model_state_parts(), params, state.tensor_parallel);
  add_parts(pieces, "optim.", ddp.state().optimizer_state_parts(*state.optimizer), params, state.tensor_parallel);
  add_whole(pieces, "scaler.", state.scaler->state_dict());
  for (const State::Entry& e : state.entries)
    if (e.not_in_snapshots.empty()) add_whole(pieces, e.prefix, e.save());
  add_whole(pieces, "", run_scalars());
  return detail::MemorySnapshots::encode(pieces);
}

StateDict Run::Impl::own_rows(const StateDict& assembled) const {
  const std::vector<nn::Parameter*> params = state.ddp->module().parameters();
  const Communicator& tp = *state.tensor_parallel;
  StateDict out;
  for (const auto& [key, t] : assembled) {
    const Shape rows = t.shape();
    const Shape slice = rows.empty() ? rows : Shape(rows.begin() + 1, rows.end());
    if (!rows.empty() && rows[0] == tp.size() && split_owner(params, key, slice) != nullptr) {
      out[key] = t.view(tp.rank() * numel_of(slice), slice);
    } else {
      out[key] = t;
    }
  }
  return out;
}

bool Run::Impl::every_rank_writes() const { return state.ddp->sharded() || state.tensor_parallel != nullptr; }

std::string Run::Impl::snapshot_tp() const {
  return std::to_string(state.tensor_parallel != nullptr ? state.tensor_parallel->size() : 1);
}

void Run::Impl::start_snapshots() {
  const bool sharded = every_rank_writes();
  std::uint64_t bytes = 0;
  if (snapshots->writes(sharded)) {
    // The file a write makes, its metadata's values stood in for by 20 digits (an i64's most).
    io::Metadata md = metadata_of(options);
    md["snapshot.step"] = md["snapshot.part"] = md["snapshot.parts"] = std::string(20, '0');
    md[kSnapshotTp] = snapshot_tp();
    md["snapshot.run"] = std::string(20, '0');
    bytes = io::detail::plan_checkpoint(snapshot_part(), md, "memory snapshot").file_size;
  }
  snapshot_node_bytes = snapshots->check_space(bytes, sharded);
  snapshot_folder = snapshots->dir();
}

void Run::Impl::write_snapshot() {
  const bool sharded = every_rank_writes();
  StateDict part;
  if (snapshots->writes(sharded)) {
    // The parts are views of the live buffers: the step's kernels must be done with them.
    state.ddp->module().stream().synchronize();
    part = snapshot_part();
  }
  try {
    io::Metadata md = metadata_of(options);
    md[kSnapshotTp] = snapshot_tp();
    snapshots->write(part, md, step, sharded);
  } catch (const Error& e) {
    TUTTI_THROW(Error, "writing the memory snapshot of step ", step, " to ", snapshots->dir(), " failed: ", e.what());
  }
}

void Run::Impl::snapshot_this_step() {
  const auto t0 = std::chrono::steady_clock::now();
  write_snapshot();
  end.snapshot = true;
  end.snapshot_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  snapshot_step = step;
}

void Run::Impl::maybe_snapshot(bool last, bool stop) {
  if (!snapshots) return;
  constexpr std::int64_t kAutoAfter = 5;  // steps of the run before auto's first snapshot
  const auto now = std::chrono::steady_clock::now();
  if (snapshot_every == 0 && step > first_step + 1) {
    // Auto, not chosen yet: the training time between end_step()s (the first step warms up).
    timed_seconds += std::chrono::duration<double>(now - last_step_end).count();
    ++timed_steps;
  }
  const bool due = snapshot_every > 0 ? step % snapshot_every == 0 : step == first_step + kAutoAfter;
  if (due && !last && !stop) {
    snapshot_this_step();
    if (snapshot_every == 0) {
      // K such that one snapshot every K steps takes at most snapshot_cost of the time, or, with
      // the MTBF, Young and Daly's interval sqrt(2 C MTBF), which balances the snapshots' cost
      // against the work a failure loses; the ranks take the largest (COLLECTIVE: every rank is
      // here after the same step).
      const double step_seconds = timed_steps > 0 ? timed_seconds / timed_steps : end.snapshot_seconds;
      const std::int64_t k = detail::auto_snapshot_interval(end.snapshot_seconds, step_seconds, options.snapshots.cost,
                                                            options.snapshots.mtbf);
      const Tensor vote = Tensor::from_ints({k}, {1}, DType::i64);
      CallOptions call;
      call.label = "memory snapshot interval";
      cpu_comm->allreduce(vote, ReduceOp::max, call).wait();
      snapshot_every = vote.to_ints()[0];
    }
  }
  end.snapshot_every = snapshot_every;
  last_step_end = std::chrono::steady_clock::now();
}

}  // namespace tutti::train
