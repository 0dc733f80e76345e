#include "tutti/data/dataset.h"

namespace tutti::data {

void Dataset::validate(const char* what) const {
  TUTTI_CHECK_ARG(images.defined() && labels.defined(), what, ": images and labels must both be defined");
  TUTTI_CHECK_ARG(images.device().is_cpu() && labels.device().is_cpu(), what,
                  ": images and labels must be CPU tensors, got ", images.str(), " and ", labels.str());
  TUTTI_CHECK_ARG(images.ndim() >= 1 && labels.ndim() == 1, what, ": images must be [N, ...] and labels [N], got ",
                  images.str(), " and ", labels.str());
  TUTTI_CHECK_ARG(images.dim(0) == labels.dim(0), what, ": ", images.dim(0), " images but ", labels.dim(0), " labels");
}

Dataset Dataset::slice(std::int64_t begin, std::int64_t end) const {
  validate();
  TUTTI_CHECK_ARG(0 <= begin && begin <= end && end <= size(), "Dataset::slice: rows [", begin, ", ", end,
                  ") of a dataset of ", size());
  const std::int64_t row = size() == 0 ? 0 : images.numel() / size();
  Shape image_shape = images.shape();
  image_shape[0] = end - begin;
  return Dataset{images.view(begin * row, image_shape), labels.view(begin, {end - begin})};
}

Dataset eval_shard(const Dataset& dataset, int rank, int world_size) {
  TUTTI_CHECK_ARG(world_size >= 1 && rank >= 0 && rank < world_size, "eval_shard: rank ", rank, " of world size ",
                  world_size);
  const std::int64_t n = dataset.size();
  return dataset.slice(rank * n / world_size, (rank + 1) * n / world_size);
}

}  // namespace tutti::data
