// train::Run's checkpoints: the resume (every rank reads the file) and the one function that
// writes one (write_checkpoint), with its once-a-step hook (check_background_work).
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "io/checkpoint_file.h"
#include "train/run_impl.h"
#include "tutti/amp/loss_scaler.h"
#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"
#include "tutti/io/checkpoint.h"
#include "tutti/nn/module.h"
#include "tutti/optim/optimizer.h"
#include "tutti/parallel/tensor_parallel.h"

namespace tutti::train {
namespace {

// A collective entry of a tensor-parallel run, saved per rank of the group (State::tensor_parallel).
constexpr const char* kTpSize = "tp.size";
std::string tp_prefix(int rank) { return "tp" + std::to_string(rank) + "."; }

// COLLECTIVE over `tp`: every rank's `mine` (the same names and shapes on every rank, its own
// values: PowerSGD's state of its slices) as "tp<r>.<key>" for each rank r, with "tp.size".
// The gathers run on the model's device (nccl takes no host tensors); the result is on the host.
StateDict per_tp_rank(const StateDict& mine, Communicator& tp, const Device& device, const Stream& stream,
                      const std::string& prefix) {
  const std::string label = "the checkpoint's '" + prefix + "' state over the tensor-parallel group";
  // The layouts first: a rank whose entry differs fails here, naming it, rather than in a gather.
  std::int64_t elements = 0;
  for (const auto& [key, t] : mine) elements += t.numel();
  const Tensor layout =
      Tensor::from_ints({static_cast<std::int64_t>(mine.size()), elements}, {2}, DType::i64).to(device, stream);
  const Tensor layouts = Tensor::empty({2 * tp.size()}, DType::i64, device);
  tp.allgather(layout, layouts, {.label = label + " (its layout)", .stream = stream}).wait(stream);
  const Tensor host_layouts = layouts.to(Device::cpu(), stream);
  stream.synchronize();
  const std::vector<std::int64_t> all = host_layouts.to_ints();
  for (int r = 1; r < tp.size(); ++r) {
    TUTTI_CHECK_ARG(all[2 * r] == all[0] && all[2 * r + 1] == all[1], "checkpoint: the state entry '", prefix,
                    "' holds ", all[2 * r], " tensor(s) of ", all[2 * r + 1], " element(s) on rank ", r,
                    " of the tensor-parallel group and ", all[0], " of ", all[1],
                    " on rank 0: a collective entry needs the same names and shapes on every rank");
  }
  StateDict out;
  out[kTpSize] = int_scalar_tensor(tp.size());
  for (const auto& [key, t] : mine) {
    const std::int64_t n = t.numel();
    const Tensor gathered = Tensor::empty({tp.size() * n}, t.dtype(), device);
    tp.allgather(t.to(device, stream).reshape({n}), gathered, {.label = label, .stream = stream}).wait(stream);
    const Tensor host = gathered.to(Device::cpu(), stream);
    stream.synchronize();
    for (int r = 0; r < tp.size(); ++r) out[tp_prefix(r) + key] = host.view(r * n, t.shape());
  }
  return out;
}

// This rank's part of a collective entry as per_tp_rank saved it; {} (the entry then starts
// afresh) with `why` set when the checkpoint was written at another tensor-parallel size.
StateDict tp_rank_part(const StateDict& saved, const Communicator* tp, std::string& why) {
  const int here = tp != nullptr ? tp->size() : 1;
  if (saved.count(kTpSize) == 0) {
    if (here == 1 || saved.empty()) return saved;
    why = "saved without tensor parallelism, here a group of " + std::to_string(here);
    return {};
  }
  const std::int64_t size = get_int_scalar(saved, kTpSize);
  if (size != here) {
    why = "saved per rank of a tensor-parallel group of " + std::to_string(size) + ", here " + std::to_string(here);
    return {};
  }
  return io::strip_prefix(saved, tp_prefix(tp != nullptr ? tp->rank() : 0));
}

}  // namespace

io::Metadata metadata_of(const RunOptions& o) {
  io::Metadata m = o.metadata;
  if (!o.precision.empty()) m["precision"] = o.precision;
  return m;
}

void Run::Impl::resume_from_checkpoint() {
  const bool exists = !path.empty() && std::filesystem::exists(path);
  if (!path.empty()) {
    check_same("whether " + path + " exists (every rank reads the checkpoint: is --checkpoint-dir shared?)",
               exists ? "yes" : "no");
  }
  TUTTI_CHECK_ARG(options.resume != Resume::no || !exists || options.overwrite, "a checkpoint exists at ", path,
                  ": pass --resume to continue it (or --resume auto), or --overwrite to start afresh and replace it");
  // Memory snapshots of this run (its id is in the checkpoint folder), when at least as new
  // as the file: the survivors of a lost node hold every part between them.
  const std::string run_id = options.snapshots.every != 0 ? read_run_id() : "";
  std::optional<io::Checkpoint> memory;
  std::string memory_note;
  if (options.resume != Resume::no && !run_id.empty()) {
    snapshots = make_snapshots(run_id);
    const detail::SnapshotFound found = snapshots->find();
    std::int64_t disk_step = -1;
    if (exists) {
      const io::Metadata md = io::detail::load_checkpoint_file(path, true).metadata;
      const auto it = md.find(kStep);
      disk_step = it != md.end() ? std::stoll(it->second) : get_int_scalar(io::load_checkpoint(path).state, kStep);
    }
    const std::string problems = found.problems.empty() ? "" : "; not used: " + found.problems;
    if (found.step >= 0 && found.step >= disk_step) {
      memory = snapshots->fetch(found);
      // A tensor-parallel run's snapshot holds each tp rank's slices: only that size takes it.
      const auto tp = memory->metadata.find(kSnapshotTp);
      const std::string written_tp = tp == memory->metadata.end() ? "1" : tp->second;
      if (written_tp != snapshot_tp()) {
        memory.reset();
        memory_note = " (the memory snapshot of step " + std::to_string(found.step) + " holds slices of a " +
                      "tensor-parallel group of " + written_tp + ", here " + snapshot_tp() + ": " +
                      (exists ? "the checkpoint file at step " + std::to_string(disk_step) + " is used"
                              : "no checkpoint file: starting afresh") +
                      ")";
      }
    }
    if (memory) {
      int buddies = 0;
      for (const bool b : found.from_buddy) buddies += b ? 1 : 0;
      memory_note = " from memory (" + snapshots->dir() + ", step " + std::to_string(found.step) + ": " +
                    std::to_string(found.parts) + " part(s), " + std::to_string(buddies) + " of them a buddy's copy; " +
                    (exists ? "the checkpoint file is at step " + std::to_string(disk_step) : "no checkpoint file") +
                    problems + ")";
    } else if (memory_note.empty() && found.newest_seen > disk_step) {  // (not one of another tp size)
      memory_note = " (memory snapshots reach step " + std::to_string(found.newest_seen) +
                    " but some part of every one of them is lost (a node and its buddy, or no buddy): " +
                    (exists ? "the checkpoint file at step " + std::to_string(disk_step) + " is used, " +
                                  std::to_string(found.newest_seen - disk_step) + " step(s) lost"
                            : "no checkpoint file: starting afresh") +
                    problems + ")";
    } else if (memory_note.empty() && !problems.empty()) {
      memory_note = " (memory snapshots" + problems + ")";
    }
  }
  TUTTI_CHECK_ARG(options.resume != Resume::yes || exists || memory, "--resume: no checkpoint at ", path,
                  " (--resume auto starts afresh when there is none)");
  if (options.resume == Resume::no || (!exists && !memory)) {
    if (options.snapshots.every != 0) snapshots = make_snapshots(new_run_id(run_id));
    note = memory_note;
    return;
  }
  from_memory = memory.has_value();
  if (from_memory) {
    load_state(*memory, snapshots->dir());
    memory.reset();
  } else {
    load_state(io::load_checkpoint(path), path);
  }
  note = memory_note + note;
  if (options.snapshots.every != 0 && !snapshots) snapshots = make_snapshots(run_id.empty() ? new_run_id("") : run_id);
}

namespace {

// State the checkpoint holds that no part of this run reads, by its first name component
// (" (the checkpoint's 'powersgd.' state, 12 tensor(s), is read by no part of this run: not
// used)"): the state of a component the saving run had and this one lacks.
std::string unread_state_note(const StateDict& saved, const std::vector<State::Entry>& entries) {
  for (const State::Entry& e : entries) {
    if (e.prefix.empty()) return "";  // it may read any name
  }
  std::map<std::string, int> unread;
  for (const auto& entry : saved) {
    const std::string& key = entry.first;
    bool read = false;
    for (const char* own : {"model.", "optim.", "scaler.", "train."}) read = read || key.starts_with(own);
    for (const State::Entry& e : entries) read = read || key.starts_with(e.prefix);
    if (read) continue;
    const std::size_t dot = key.find('.');
    ++unread[dot == std::string::npos ? key : key.substr(0, dot + 1)];
  }
  std::string note;
  for (const auto& [group, count] : unread) {
    note += " (the checkpoint's '" + group + "' state, " + std::to_string(count) +
            " tensor(s), is read by no part of this run: not used)";
  }
  return note;
}

}  // namespace

void Run::Impl::load_state(const io::Checkpoint& ckpt, const std::string& source) {
  for (const std::string& key : options.must_match) {
    const auto mine = options.metadata.find(key);
    if (mine != options.metadata.end()) io::check_metadata(ckpt, key, mine->second, source);
  }
  // Whole tensors by name, whatever the number of ranks and the ZeRO stage that wrote them.
  ddp::DistributedDataParallel& ddp = *state.ddp;
  const StateDict model_state = io::strip_prefix(ckpt.state, "model.");
  // A tensor-parallel model: the checkpoint holds the whole tensors; this rank takes its slices.
  // From memory, its slices as rows of [tp, slice...] tensors (a snapshot of the same size).
  nn::Module& model = ddp.module();
  const bool rows = from_memory && state.tensor_parallel != nullptr;
  StateDict expected = model.extra_state();
  for (const nn::Parameter* p : model.parameters()) {
    const bool split = state.tensor_parallel != nullptr && !p->init_slice.full.empty();
    Shape shape = split && !rows ? p->init_slice.full : p->shape();
    if (split && rows) shape.insert(shape.begin(), state.tensor_parallel->size());
    expected[p->name] = Tensor::empty(shape, DType::f32);
  }
  io::check_state_matches(model_state, expected, source);
  const StateDict optim_state = io::strip_prefix(ckpt.state, "optim.");
  if (rows) {
    ddp.state().load_model_state_dict(own_rows(model_state));
    ddp.state().load_optimizer_state_dict(*state.optimizer, own_rows(optim_state));
  } else if (state.tensor_parallel) {
    ddp.state().load_model_state_dict(parallel::split_state_dict(model_state, model));
    ddp.state().load_optimizer_state_dict(*state.optimizer, parallel::split_state_dict(optim_state, model));
  } else {
    ddp.state().load_model_state_dict(model_state);
    ddp.state().load_optimizer_state_dict(*state.optimizer, optim_state);
  }
  // The loss scaler's state belongs to the precision it was saved with: an fp32 run's (off,
  // scale 1) would start an fp16 run at scale 1 instead of the default 2^16.
  const auto saved_precision = ckpt.metadata.find("precision");
  if (options.precision.empty() || saved_precision == ckpt.metadata.end() ||
      saved_precision->second == options.precision) {
    state.scaler->load_state_dict(io::strip_prefix(ckpt.state, "scaler."));
  } else {
    note = " (checkpoint written in " + saved_precision->second + ": the loss scaler starts afresh)";
  }
  // Each entry continues exactly, or the note says what it did instead (PowerSGD: restarted,
  // its error zeroed on another world size, its state unused by a run without it).
  for (const State::Entry& e : state.entries) {
    std::string said;
    if (from_memory && !e.not_in_snapshots.empty()) {
      said = e.not_in_snapshots;
    } else {
      StateDict saved = io::strip_prefix(ckpt.state, e.prefix);
      std::string why;  // a tensor-parallel run's collective entry of another group size
      if (e.collective) saved = tp_rank_part(saved, state.tensor_parallel, why);
      said = e.load(saved);
      if (!why.empty()) said += (said.empty() ? "" : "; ") + ("'" + e.prefix + "' was " + why);
    }
    if (!said.empty()) note += " (" + said + ")";
  }
  note += unread_state_note(ckpt.state, state.entries);
  step = get_int_scalar(ckpt.state, kStep);
  if (ckpt.state.count(kLastLoss)) loss = get_scalar(ckpt.state, kLastLoss);
  if (ckpt.state.count(kUsefulUs)) restored_useful_s = static_cast<double>(get_int_scalar(ckpt.state, kUsefulUs)) / 1e6;
  resumed = true;
  saved_step = step;
  saved_loss = loss;
}

void Run::Impl::write_checkpoint(bool must) {
  ddp::DistributedDataParallel& ddp = *state.ddp;
  StateDict model_state, optim_state, collected;
  std::int64_t early_busy_step = -1;  // ZeRO: the write rank 0 waited for before gathering
  double early_wait_s = 0;
  // Collective entries (State::add_collective, PowerSGD's) on every rank first: rank 0 saves
  // its result.
  // A tensor-parallel run's: every rank of each group its own, gathered over the group.
  for (const State::Entry& e : state.entries) {
    if (!e.collective) continue;
    StateDict mine = e.save();
    if (state.tensor_parallel != nullptr && state.tensor_parallel->size() > 1) {
      mine = per_tp_rank(mine, *state.tensor_parallel, ddp.module().device(), ddp.module().stream(), e.prefix);
    }
    io::add_prefixed(collected, e.prefix, mine);
  }
  if (state.tensor_parallel) {
    // A split model: the whole tensors over the data-parallel ranks (ZeRO's shards: collective
    // over them), then over the tensor-parallel group of rank 0, the one whose ranks have
    // data-parallel rank 0 (a mesh's layout); the other groups' gathers would be thrown away.
    const bool rank0_group = ddp.reducer().communicator().rank() == 0;
    if (!rank0_group && !ddp.sharded()) return;  // nothing collective to take part in
    StateDict model_whole = ddp.state().model_state_dict(),
              optim_whole = ddp.state().optimizer_state_dict(*state.optimizer);
    if (!rank0_group) return;
    Communicator& tp = *state.tensor_parallel;
    model_state = parallel::whole_state_dict(model_whole, ddp.module(), tp);
    optim_state = parallel::whole_state_dict(optim_whole, ddp.module(), tp);
    if (rank != 0) return;
  } else if (!ddp.sharded()) {
    // Every rank holds the whole tensors: rank 0 alone hands the live ones to the writer,
    // which copies them (not collective). An optimizer that is not attached has no views:
    // its state_dict() (a copy, also not collective at stage 0).
    if (rank != 0) return;
    model_state = ddp.state().model_state_views();
    try {
      optim_state = ddp.state().optimizer_state_views(*state.optimizer);
    } catch (const InvalidArgument&) {
      optim_state = ddp.state().optimizer_state_dict(*state.optimizer);
    }
  } else {
    // ZeRO: every rank gathers the whole tensors from the shards (collective). A write in flight
    // holds the previous gather (handed over below): rank 0 waits for it first, when the save
    // would wait anyway, so that the host holds one gathered state at a time.
    if (rank == 0 && writer->busy() && (must || options.checkpoint_busy == io::WhenBusy::wait)) {
      const auto t0 = std::chrono::steady_clock::now();
      early_busy_step = pending_step;
      if (hooks.checkpoint.before_wait) hooks.checkpoint.before_wait(pending_step);
      try {
        writer->finish();
      } catch (const Error& e) {
        if (std::string_view(e.what()).find(path) != std::string_view::npos) throw;
        TUTTI_THROW(Error, "saving the checkpoint of step ", step, " to ", path, " failed: ", e.what());
      }
      note_written();
      early_wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    model_state = ddp.state().model_state_dict();
    optim_state = ddp.state().optimizer_state_dict(*state.optimizer);
    if (rank != 0) return;
  }
  // Rank 0. A failure throws an Error naming the step and the file (the Job tells the other
  // ranks its message); the writer's own errors already name them.
  io::SaveResult r;
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    StateDict all;
    io::add_prefixed(all, "scaler.", state.scaler->state_dict());
    for (const State::Entry& e : state.entries)
      if (!e.collective) io::add_prefixed(all, e.prefix, e.save());
    for (auto& [key, t] : collected) all[key] = t;
    io::add_prefixed(all, "", run_scalars());
    // Stage 0 hands the writer live views, which it copies; ZeRO's (and a split model's) gathered
    // state was made for this checkpoint and is handed over, written where it is: the host holds
    // it once.
    StateDict gathered;
    const bool made_for_it = ddp.sharded() || state.tensor_parallel != nullptr;  // not live views
    io::add_prefixed(made_for_it ? gathered : all, "model.", model_state);
    io::add_prefixed(made_for_it ? gathered : all, "optim.", optim_state);
    model_state = {};
    optim_state = {};
    io::Metadata metadata = metadata_of(options);
    metadata[kStep] = std::to_string(step);  // read alone on a resume, to compare with memory snapshots
    if (must) {
      // The last step's checkpoint or a stop's: never skipped, and complete on return.
      const auto t0 = std::chrono::steady_clock::now();
      const std::int64_t busy = writer->busy() ? pending_step : -1;
      writer->finish();
      note_written();
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r = writer->save_handing_over(path, step, all, std::move(gathered), metadata, ddp.module().stream());
      writer->finish();
      r.busy_step = busy;
      r.waited_s += waited;
    } else {
      note_written();
      r = writer->save_handing_over(path, step, all, std::move(gathered), metadata, ddp.module().stream());
      note_written();  // the write this one waited for
    }
  } catch (const Error& e) {
    if (std::string_view(e.what()).find(path) != std::string_view::npos) throw;
    TUTTI_THROW(Error, "saving the checkpoint of step ", step, " to ", path, " failed: ", e.what());
  } catch (const std::exception& e) {
    TUTTI_THROW(Error, "saving the checkpoint of step ", step, " to ", path, " failed: ", e.what());
  }
  if (early_busy_step >= 0) {
    r.busy_step = early_busy_step;
    r.waited_s += early_wait_s;
  }
  end.checkpoint_skipped = r.skipped;
  end.checkpoint_busy_step = r.busy_step;
  end.checkpoint_waited_seconds = r.waited_s;
  if (!r.skipped) {
    pending_step = step;
    pending_loss = loss;
  }
  note_written();
}

void Run::Impl::note_written() {
  if (writer && pending_step >= 0 && writer->last_written_step() == pending_step) {
    saved_step = pending_step;
    saved_loss = pending_loss;
    pending_step = -1;
  }
}

void Run::Impl::check_background_work() {
  // Rank 0: a background write that failed ends the job here, with its cause (the writer's
  // error names the file and the step), before the step's collective: the Job (or the
  // ThreadGroup) ends the other ranks.
  if (!writer) return;
  writer->check();
  note_written();
}

void Run::Impl::wait_background_work() {
  // Rank 0: the write in flight completes (or throws its failure) before the ending is
  // agreed, so that "Checkpoint written to" and "the last good checkpoint" are true.
  if (!writer) return;
  writer->finish();
  note_written();
}

}  // namespace tutti::train
