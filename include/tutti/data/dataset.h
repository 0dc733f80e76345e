// Dataset: a set of samples held in memory as two CPU tensors with the same first dimension,
// inputs (images) and targets (labels). Sample i is row i of both.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::data {

struct Dataset {
  Tensor images;  // [N, ...] (f32 for the loaders in this folder)
  Tensor labels;  // [N] (i32 class indices)

  // N, the number of samples (0 for an undefined dataset).
  std::int64_t size() const { return images.defined() ? images.dim(0) : 0; }
  // Throws InvalidArgument unless both tensors are defined, on the CPU, and have the same
  // number of rows, labels being 1-D. `what` names the dataset in the message.
  void validate(const char* what = "dataset") const;
  // Rows [begin, end) of both tensors, as views that share storage (no copy).
  Dataset slice(std::int64_t begin, std::int64_t end) const;
};

// This rank's contiguous share of a dataset for evaluation, where every sample must be seen
// exactly once across ranks: rows [rank·N/world, (rank+1)·N/world) (integer division, so
// shares differ by at most one row and any N works). A view; nothing is copied.
Dataset eval_shard(const Dataset& dataset, int rank, int world_size);

}  // namespace tutti::data
