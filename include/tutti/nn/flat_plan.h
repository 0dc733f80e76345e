// FlatPlan: THE flat layout of a model's parameters, gradients and optimizer state.
//
// One function, make_flat_plan, decides where every parameter lives in a flat buffer: the
// order (REVERSE registration order, the order in which backward produces gradients), each
// offset (a multiple of align_elements, so every view is vector-aligned), the buckets the
// data-parallel runtime reduces (cut at parameter boundaries: about first_bucket_cap_mb
// first, bucket_cap_mb after), the padding, and each rank's shard of every bucket (ZeRO).
// Everybody takes the plan explicitly, nobody infers it: FlatStorage::flatten lays the
// values (and compute copies) out by it, FlatStorage::set_grad_buffer / allocate_grads the
// gradients, ddp::Reducer its buckets and shards, and an optimizer bound to flat buffers
// (optim::Optimizer::bind) its state; buffers in two different plans are an error.
//
// Shards: with world_size N every bucket's length is a multiple of N · align_elements, and
// rank r owns chunk r of each bucket: [begin + r · chunk, begin + (r + 1) · chunk). A rank's
// shard is its chunks of every bucket, back to back in bucket order (bucket b's chunk at
// shard offset b.shard_offset): the layout of a sharded optimizer's state and of ZeRO's
// master weights and gradient shard. Padding elements belong to no parameter and stay zero.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tutti/core/tensor.h"
#include "tutti/nn/parameter.h"

namespace tutti::nn {

// What the plan needs to know of a parameter (or of a gradient a program's own kernels write).
struct PlanParam {
  std::string name;  // for error messages and checkpoints: "2.weight"
  Shape shape;
  bool requires_grad = true;  // false: a frozen weight (its gradient slot exists but is never reduced)
};

struct FlatPlanOptions {
  // Every parameter's offset, every bucket's bounds and every shard chunk are multiples of this.
  std::int64_t align_elements = 8;
  // Bucket sizes in MiB of gradients of `grad_element_bytes` bytes each.
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  std::size_t grad_element_bytes = 4;
  // Ranks the buckets are sharded over (1: no sharding, no padding beyond alignment).
  int world_size = 1;
  // Empty, or one segment id per parameter (registration order): a bucket never holds
  // parameters of two segments, so a run of parameters with the same id starts a bucket of its
  // own (the caps still apply within it). ZeRO-3 cuts its gather groups so, one per block.
  std::vector<int> segments;
};

// A half-open range of elements of the flat buffer.
struct ElementRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
};

struct PlanEntry {
  std::string name;
  Shape shape;
  std::int64_t numel = 0;
  std::int64_t offset = 0;  // elements into the flat buffer
  int bucket = 0;           // index into FlatPlan::buckets
  bool requires_grad = true;
};

struct PlanBucket {
  std::int64_t begin = 0, end = 0;   // elements of the flat buffer, padding included
  std::int64_t chunk = 0;            // (end - begin) / world_size: one rank's part
  std::int64_t shard_offset = 0;     // where this bucket's chunk lies in every rank's shard
  std::vector<std::size_t> entries;  // its parameters (indices into entries), in layout order
  std::int64_t numel() const { return end - begin; }
  // Rank r's chunk, as a range of the flat buffer.
  ElementRange chunk_of(int rank) const { return {begin + rank * chunk, begin + (rank + 1) * chunk}; }
};

struct FlatPlan {
  std::vector<PlanEntry> entries;   // registration order: entries[i] is parameter i
  std::vector<PlanBucket> buckets;  // in layout order, which is the order they are reduced in
  std::int64_t total = 0;           // the flat buffer's length
  std::int64_t shard_numel = 0;     // each rank's shard length: the sum of the chunks
  FlatPlanOptions options;

  int world_size() const { return options.world_size; }
  // Rank r's chunks of every bucket, in bucket order (their shard offsets follow each other).
  std::vector<ElementRange> shard_ranges(int rank) const;
  // The elements of entry `e` (flat buffer offsets) that lie in rank r's chunk of its bucket;
  // empty (begin == end) when none do.
  ElementRange owned_part(const PlanEntry& e, int rank) const;
  // One line per entry and bucket: for error messages and tests.
  std::string describe() const;
  // Same entries at the same offsets, same buckets and shards.
  bool operator==(const FlatPlan& other) const;
  // Throws InvalidArgument unless `params` are the plan's entries (same count, names, shapes
  // and order); `what` names the caller.
  void check_matches(const std::vector<Parameter*>& params, const char* what) const;
};

// What the plan needs of each parameter (name, shape, requires_grad), in the same order.
std::vector<PlanParam> plan_params(const std::vector<Parameter*>& params);

// THE function that lays parameters out. Throws InvalidArgument on bad options.
FlatPlan make_flat_plan(const std::vector<PlanParam>& params, const FlatPlanOptions& options = {});
FlatPlan make_flat_plan(const std::vector<Parameter*>& params, const FlatPlanOptions& options = {});

}  // namespace tutti::nn
