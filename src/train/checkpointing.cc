// train::Run's checkpoints: the resume (every rank reads the file) and the one function that
// writes one (write_checkpoint), with its once-a-step hook (check_background_work).
#include <chrono>
#include <filesystem>
#include <string_view>

#include "train/run_impl.h"
#include "tutti/amp/loss_scaler.h"
#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"
#include "tutti/io/checkpoint.h"
#include "tutti/nn/module.h"
#include "tutti/optim/optimizer.h"

namespace tutti::train {
namespace {

constexpr const char* kStep = "train.step";
constexpr const char* kLastLoss = "train.last_loss";

io::Metadata metadata_of(const RunOptions& o) {
  io::Metadata m = o.metadata;
  if (!o.precision.empty()) m["precision"] = o.precision;
  return m;
}

}  // namespace

void Run::Impl::resume_from_checkpoint() {
  const bool exists = !path.empty() && std::filesystem::exists(path);
  if (!path.empty()) {
    check_same("whether " + path + " exists (every rank reads the checkpoint: is --checkpoint-dir shared?)",
               exists ? "yes" : "no");
  }
  TUTTI_CHECK_ARG(options.resume != Resume::yes || exists, "--resume: no checkpoint at ", path,
                  " (--resume auto starts afresh when there is none)");
  TUTTI_CHECK_ARG(options.resume != Resume::no || !exists || options.overwrite, "a checkpoint exists at ", path,
                  ": pass --resume to continue it (or --resume auto), or --overwrite to start afresh and replace it");
  if (options.resume == Resume::no || !exists) return;

  const io::Checkpoint ckpt = io::load_checkpoint(path);
  for (const std::string& key : options.must_match) {
    const auto mine = options.metadata.find(key);
    if (mine != options.metadata.end()) io::check_metadata(ckpt, key, mine->second, path);
  }
  // Whole tensors by name, whatever the number of ranks and the ZeRO stage that wrote them.
  ddp::DistributedDataParallel& ddp = *state.ddp;
  const StateDict model_state = io::strip_prefix(ckpt.state, "model.");
  StateDict expected = ddp.module().extra_state();
  for (const nn::Parameter* p : ddp.module().parameters()) expected[p->name] = Tensor::empty(p->shape(), DType::f32);
  io::check_state_matches(model_state, expected, path);
  ddp.load_model_state_dict(model_state);
  ddp.load_optimizer_state_dict(*state.optimizer, io::strip_prefix(ckpt.state, "optim."));
  // The loss scaler's state belongs to the precision it was saved with: an fp32 run's (off,
  // scale 1) would start an fp16 run at scale 1 instead of the default 2^16.
  const auto saved_precision = ckpt.metadata.find("precision");
  if (options.precision.empty() || saved_precision == ckpt.metadata.end() ||
      saved_precision->second == options.precision) {
    state.scaler->load_state_dict(io::strip_prefix(ckpt.state, "scaler."));
  } else {
    note = " (checkpoint written in " + saved_precision->second + ": the loss scaler starts afresh)";
  }
  for (const State::Entry& e : state.entries) e.load(io::strip_prefix(ckpt.state, e.prefix));
  step = get_int_scalar(ckpt.state, kStep);
  if (ckpt.state.count(kLastLoss)) loss = get_scalar(ckpt.state, kLastLoss);
  resumed = true;
  saved_step = step;
  saved_loss = loss;
}

void Run::Impl::write_checkpoint(bool must) {
  ddp::DistributedDataParallel& ddp = *state.ddp;
  StateDict model_state, optim_state;
  if (ddp.zero_stage() == 0) {
    // Every rank holds the whole tensors: rank 0 alone hands the live ones to the writer,
    // which copies them (not collective). An optimizer that is not attached has no views:
    // its state_dict() (a copy, also not collective at stage 0).
    if (rank != 0) return;
    model_state = ddp.model_state_views();
    try {
      optim_state = ddp.optimizer_state_views(*state.optimizer);
    } catch (const InvalidArgument&) {
      optim_state = ddp.optimizer_state_dict(*state.optimizer);
    }
  } else {
    // ZeRO: every rank gathers the whole tensors from the shards (collective).
    model_state = ddp.model_state_dict();
    optim_state = ddp.optimizer_state_dict(*state.optimizer);
    if (rank != 0) return;
  }
  // Rank 0. A failure throws an Error naming the step and the file (the Job tells the other
  // ranks its message); the writer's own errors already name them.
  io::SaveResult r;
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    StateDict all;
    io::add_prefixed(all, "scaler.", state.scaler->state_dict());
    for (const State::Entry& e : state.entries) io::add_prefixed(all, e.prefix, e.save());
    io::add_prefixed(all, "", {{kStep, int_scalar_tensor(step)}, {kLastLoss, scalar_tensor(loss)}});
    io::add_prefixed(all, "model.", model_state);
    io::add_prefixed(all, "optim.", optim_state);
    if (must) {
      // The last step's checkpoint or a stop's: never skipped, and complete on return.
      const auto t0 = std::chrono::steady_clock::now();
      const std::int64_t busy = writer->busy() ? pending_step : -1;
      writer->finish();
      note_written();
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r = writer->save(path, step, all, metadata_of(options), ddp.module().stream());
      writer->finish();
      r.busy_step = busy;
      r.waited_s += waited;
    } else {
      note_written();
      r = writer->save(path, step, all, metadata_of(options), ddp.module().stream());
      note_written();  // the write this one waited for
    }
  } catch (const Error& e) {
    if (std::string_view(e.what()).find(path) != std::string_view::npos) throw;
    TUTTI_THROW(Error, "saving the checkpoint of step ", step, " to ", path, " failed: ", e.what());
  } catch (const std::exception& e) {
    TUTTI_THROW(Error, "saving the checkpoint of step ", step, " to ", path, " failed: ", e.what());
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
