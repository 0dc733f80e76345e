// DistributedLoader: deterministic, rank-independent shuffling and sharding of a Dataset for
// data-parallel training.
//
// Every epoch has one global order of the samples, a permutation that depends only on the
// seed and the epoch number (never on the number of ranks), so a run on N ranks visits the
// same global micro-batches in the same order as a run on one: global micro-batch s of an
// epoch is positions [s·B, (s+1)·B) of that epoch's order, and rank r of N takes the rows
// [r·B/N, (r+1)·B/N) of it. Nothing here communicates; every rank computes the same order.
//
// B (global_micro_batch_size) is what one next() serves all ranks together: one
// micro-batch of every rank. With gradient accumulation over k micro-batches, an optimizer
// step consumes k of them, so its global batch (what train_fashion_mnist's --batch-size
// means) is k·B; without accumulation the two are the same.
//
// The permutation is specified exactly, so that it is the same on every platform and
// standard library: start from the identity [0, 1, ..., N-1]; seed a std::mt19937_64 with
// mix(seed + 0x9E3779B97F4A7C15·(epoch+1)) (mix: the splitmix64 finalizer, arithmetic mod
// 2^64); then Fisher-Yates: for i = N-1 down to 1, draw 64-bit x until x >= 2^64 mod (i+1)
// (rejection, so j is exactly uniform), j = x mod (i+1), swap elements i and j.
// std::shuffle and std::uniform_int_distribution are not used: their algorithms are
// implementation-defined.
//
// drop_last: an epoch has floor(N / B) steps; the last N mod B samples of each epoch's order
// are not used in that epoch (every step then has a full global micro-batch, split evenly, so
// the mean over ranks of the per-rank mean loss is the mean over the global micro-batch). Since the
// order changes each epoch, a different remainder is left out each time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/core/state_dict.h"
#include "tutti/core/tensor.h"
#include "tutti/data/dataset.h"

namespace tutti::data {

struct LoaderOptions {
  // B, the samples one next() serves all ranks together: a micro-batch of every rank, one
  // forward/backward of the job (not an optimizer step's batch when gradients accumulate:
  // that is accumulation steps x B). Must be divisible by world_size and at most the
  // dataset's size.
  std::int64_t global_micro_batch_size = 0;
  // This process's place in the job (Job::rank() / world_size()).
  int rank = 0;
  int world_size = 1;
  // With the same seed, the same order, on any number of ranks.
  std::uint64_t seed = 0;
  // false: every epoch uses the samples in their stored order (evaluation, debugging).
  bool shuffle = true;
};

// One rank's part of one global micro-batch: fresh CPU tensors (the trainer copies them to
// its device), safe to keep after the loader moves on.
struct Batch {
  Tensor images;  // [B / world_size, ...] like the dataset's images
  Tensor labels;  // [B / world_size]
  std::int64_t epoch = 0;
  std::int64_t step = 0;  // within the epoch, 0 .. steps_per_epoch()-1
};

// Where a loader is: the next batch next() returns. Saved in checkpoints, so that a resumed
// run continues with exactly the batch an uninterrupted run would have used next.
struct LoaderPosition {
  std::int64_t epoch = 0;
  std::int64_t step = 0;
  bool operator==(const LoaderPosition&) const = default;
};

// The exact permutation of [0, n) for (seed, epoch) described at the top of this file.
std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

// Not thread-safe (batch() caches the epoch's permutation); one loader per training loop.
class DistributedLoader {
 public:
  // Keeps a handle to `dataset` (no copy). Throws InvalidArgument when the dataset is not
  // valid, rank is not in [0, world_size), the global micro-batch is not positive, larger
  // than the dataset, or not divisible by world_size ("global micro-batch size 100 is not
  // divisible by world size 3").
  DistributedLoader(Dataset dataset, LoaderOptions options);

  // floor(N / B): full global micro-batches per epoch (next() calls, not optimizer steps).
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // B / world_size, the rows of every Batch this rank gets.
  std::int64_t local_micro_batch_size() const { return local_batch_; }
  const LoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return dataset_; }

  // This rank's slice of global micro-batch `step` of `epoch`. Random access: any (epoch, step)
  // in any order; the epoch's permutation is computed once and cached. Does not move the
  // position.
  Batch batch(std::int64_t epoch, std::int64_t step);
  // The sample indices (into the dataset) of this rank's slice of that batch.
  std::vector<std::int64_t> batch_indices(std::int64_t epoch, std::int64_t step);

  // batch(position()) and advance the position by one step, to step 0 of the next epoch
  // after the epoch's last step.
  Batch next();
  LoaderPosition position() const { return position_; }
  // Moves to `position` (step may equal steps_per_epoch(), meaning "at the end of the
  // epoch"; next() then starts the following one).
  void set_position(LoaderPosition position);

  // The position and what it depends on: "epoch", "step", "seed", "global_micro_batch_size",
  // "dataset_size", "shuffle" (i64 scalars; the seed's 64 bits stored in an i64). The order
  // itself needs no state: it is a function of (seed, epoch). Unprefixed, like the model's,
  // the optimizer's and the scaler's: a checkpoint puts it under a prefix with
  // io::add_prefixed(state, "loader.", loader.state_dict()).
  StateDict state_dict() const;
  // Restores the position from state_dict() (unprefixed: io::strip_prefix(state, "loader.")).
  // Throws InvalidArgument when the saved seed, dataset size or shuffle flag differ from this
  // loader's, since the position would then point at other samples. The world size may
  // differ: the global order does not depend on it. So may the global micro-batch size (the
  // accumulation steps, at the same global batch), when the position falls on a whole number
  // of this loader's micro-batches: it is converted (else InvalidArgument).
  void load_state_dict(const StateDict& state);

 private:
  const std::vector<std::int64_t>& order(std::int64_t epoch);

  Dataset dataset_;
  LoaderOptions options_;
  std::int64_t steps_per_epoch_ = 0;
  std::int64_t local_batch_ = 0;
  LoaderPosition position_;
  std::int64_t cached_epoch_ = -1;
  std::vector<std::int64_t> cached_order_;
};

}  // namespace tutti::data
