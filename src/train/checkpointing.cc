// train::Run's checkpoints: the resume (every rank reads the file) and the one function that
// writes one (write_checkpoint), with its once-a-step hook (check_background_work).
#include <filesystem>

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

void Run::Impl::write_checkpoint() {
  // Every rank gathers the model's and the optimizer's whole tensors (under ZeRO, from the
  // shards); rank 0 writes them with the rest. A failure throws an Error naming the step and
  // the file (the Job tells the other ranks its message).
  StateDict model_state = state.ddp->model_state_dict();
  StateDict optim_state = state.ddp->optimizer_state_dict(*state.optimizer);
  if (rank != 0) return;
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    StateDict all;
    io::add_prefixed(all, "scaler.", state.scaler->state_dict());
    for (const State::Entry& e : state.entries) io::add_prefixed(all, e.prefix, e.save());
    io::add_prefixed(all, "", {{kStep, int_scalar_tensor(step)}, {kLastLoss, scalar_tensor(loss)}});
    io::add_prefixed(all, "model.", std::move(model_state));
    io::add_prefixed(all, "optim.", std::move(optim_state));
    io::save_checkpoint(path, all, metadata_of(options));
  } catch (const std::exception& e) {
    TUTTI_THROW(Error, "saving the checkpoint of step ", step, " to ", path, " failed: ", e.what());
  }
}

void Run::Impl::check_background_work() {
  // Checkpoints are written synchronously in write_checkpoint(): nothing runs in the
  // background yet. An asynchronous writer throws its failure here, once a step, so that the
  // job ends with the cause before the step's collective.
}

void Run::Impl::wait_background_work() {
  // Nothing in flight (see check_background_work): an asynchronous writer waits for its last
  // write here, and throws its failure, before the run's ending is agreed.
}

}  // namespace tutti::train
