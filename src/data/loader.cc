#include "tutti/data/loader.h"

#include <optional>

#include "tutti/core/trace.h"

#include <bit>
#include <cstring>
#include <random>

namespace tutti::data {
namespace {

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;

std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Copies rows `indices` of `src` ([N, ...]) into a new [indices.size(), ...] tensor.
Tensor gather_rows(const Tensor& src, const std::vector<std::int64_t>& indices) {
  Shape shape = src.shape();
  const std::int64_t n = shape[0];
  const std::size_t row_bytes = n == 0 ? 0 : src.nbytes() / static_cast<std::size_t>(n);
  shape[0] = static_cast<std::int64_t>(indices.size());
  Tensor out = Tensor::empty(shape, src.dtype());
  const auto* from = static_cast<const unsigned char*>(src.data());
  auto* to = static_cast<unsigned char*>(out.data());
  for (std::size_t i = 0; i < indices.size(); ++i) {
    std::memcpy(to + i * row_bytes, from + static_cast<std::size_t>(indices[i]) * row_bytes, row_bytes);
  }
  return out;
}

}  // namespace

std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  TUTTI_CHECK_ARG(n >= 0 && epoch >= 0, "epoch_permutation: n = ", n, ", epoch = ", epoch, " (both must be >= 0)");
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  std::mt19937_64 engine(splitmix64_mix(seed + kGolden * (static_cast<std::uint64_t>(epoch) + 1)));
  for (std::int64_t i = n - 1; i >= 1; --i) {
    const std::uint64_t bound = static_cast<std::uint64_t>(i) + 1;
    const std::uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    std::uint64_t x = engine();
    while (x < threshold) x = engine();
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(x % bound)]);
  }
  return order;
}

DistributedLoader::DistributedLoader(Dataset dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  dataset_.validate("DistributedLoader: dataset");
  const auto& o = options_;
  TUTTI_CHECK_ARG(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "DistributedLoader: rank ", o.rank,
                  " is not in [0, world size ", o.world_size, ")");
  TUTTI_CHECK_ARG(o.global_micro_batch_size > 0, "DistributedLoader: global micro-batch size must be positive, got ",
                  o.global_micro_batch_size);
  TUTTI_CHECK_ARG(o.global_micro_batch_size % o.world_size == 0, "DistributedLoader: global micro-batch size ",
                  o.global_micro_batch_size, " is not divisible by world size ", o.world_size,
                  ": every rank must get the same number of samples (choose a batch size that is a multiple of ",
                  o.world_size, ")");
  TUTTI_CHECK_ARG(o.global_micro_batch_size <= dataset_.size(), "DistributedLoader: global micro-batch size ",
                  o.global_micro_batch_size, " is larger than the dataset (", dataset_.size(), " samples)");
  steps_per_epoch_ = dataset_.size() / o.global_micro_batch_size;
  local_batch_ = o.global_micro_batch_size / o.world_size;
}

const std::vector<std::int64_t>& DistributedLoader::order(std::int64_t epoch) {
  if (epoch != cached_epoch_) {
    if (options_.shuffle) {
      cached_order_ = epoch_permutation(dataset_.size(), options_.seed, epoch);
    } else {
      cached_order_.resize(static_cast<std::size_t>(dataset_.size()));
      for (std::size_t i = 0; i < cached_order_.size(); ++i) cached_order_[i] = static_cast<std::int64_t>(i);
    }
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

std::vector<std::int64_t> DistributedLoader::batch_indices(std::int64_t epoch, std::int64_t step) {
  TUTTI_CHECK_ARG(epoch >= 0 && step >= 0 && step < steps_per_epoch_, "DistributedLoader: step ", step, " of epoch ",
                  epoch, " does not exist (an epoch has ", steps_per_epoch_, " steps)");
  const auto& ord = order(epoch);
  const std::int64_t begin = step * options_.global_micro_batch_size + options_.rank * local_batch_;
  return std::vector<std::int64_t>(ord.begin() + begin, ord.begin() + begin + local_batch_);
}

Batch DistributedLoader::batch(std::int64_t epoch, std::int64_t step) {
  const std::vector<std::int64_t> indices = batch_indices(epoch, step);
  return Batch{gather_rows(dataset_.images, indices), gather_rows(dataset_.labels, indices), epoch, step};
}

Batch DistributedLoader::next() {
  std::optional<trace::Span> span;
  if (trace::on()) span.emplace("data", "data");
  if (position_.step >= steps_per_epoch_) position_ = {position_.epoch + 1, 0};
  Batch b = batch(position_.epoch, position_.step);
  ++position_.step;
  return b;
}

void DistributedLoader::set_position(LoaderPosition position) {
  TUTTI_CHECK_ARG(position.epoch >= 0 && position.step >= 0 && position.step <= steps_per_epoch_,
                  "DistributedLoader::set_position: epoch ", position.epoch, " step ", position.step, " (an epoch has ",
                  steps_per_epoch_, " steps)");
  position_ = position;
}

StateDict DistributedLoader::state_dict() const {
  StateDict s;
  s["epoch"] = int_scalar_tensor(position_.epoch);
  s["step"] = int_scalar_tensor(position_.step);
  s["seed"] = int_scalar_tensor(std::bit_cast<std::int64_t>(options_.seed));
  s["global_micro_batch_size"] = int_scalar_tensor(options_.global_micro_batch_size);
  s["dataset_size"] = int_scalar_tensor(dataset_.size());
  s["shuffle"] = int_scalar_tensor(options_.shuffle ? 1 : 0);
  return s;
}

void DistributedLoader::load_state_dict(const StateDict& state) {
  const auto seed = std::bit_cast<std::uint64_t>(get_int_scalar(state, "seed"));
  const std::int64_t batch = get_int_scalar(state, "global_micro_batch_size");
  const std::int64_t size = get_int_scalar(state, "dataset_size");
  TUTTI_CHECK_ARG(seed == options_.seed, "cannot resume the data order: it was saved with seed ", seed,
                  ", this run uses seed ", options_.seed);
  // Another micro-batch size (accumulation steps that changed with the world size, at the same
  // global batch) serves the same samples in the same order: the position is converted when it
  // falls on a boundary of the new size.
  const std::int64_t mine = options_.global_micro_batch_size;
  const std::int64_t samples = get_int_scalar(state, "step") * batch;
  TUTTI_CHECK_ARG(batch == mine || samples % mine == 0, "cannot resume the data order: it was saved with ",
                  "global micro-batch size ", batch, " at sample ", samples,
                  " of the epoch, which is not a whole "
                  "number of this run's micro-batches of ",
                  mine);
  TUTTI_CHECK_ARG(size == dataset_.size(), "cannot resume the data order: it was saved for a dataset of ", size,
                  " samples, this one has ", dataset_.size());
  const bool shuffle = get_int_scalar(state, "shuffle") != 0;
  TUTTI_CHECK_ARG(shuffle == options_.shuffle, "cannot resume the data order: it was saved with shuffling ",
                  shuffle ? "on" : "off", ", this run has it ", options_.shuffle ? "on" : "off");
  set_position({get_int_scalar(state, "epoch"), samples / mine});
}

}  // namespace tutti::data
