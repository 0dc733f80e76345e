// ZeRO-3's parameters (ShardParameters, ddp/sharding.h; its strategy: zero3_strategy.cc).
//
// Who owns what. This object owns, for the whole life of the DistributedDataParallel:
//   - the compute shard: this rank's chunk of every bucket in the compute dtype (half), what the
//     gathers read; under f32 compute it is the fp32 master shard itself (the strategy's),
//   - two gather buffers, each as long as the largest non-resident group (bucket), in the
//     compute dtype: a group is whole only while it sits in one of them,
//   - one buffer per resident bucket (the parameters outside every group), whole for good.
// The Parameters' value (f32) or compute (half) tensors are views into these buffers, placed
// when a group is gathered into a buffer and made undefined when the buffer is given to another
// group, so a layer that reads a released parameter fails at once instead of reading stale data.
//
// When a gather buffer is freed (given to another group): use(b) of a group not whole takes the
// buffer that does not hold the group in use (the previous one, done by then); the prefetch of
// the next group takes the other buffer than b's, whose previous occupant is done as well. Both
// gathers are issued on the model's stream (ordered after the kernels that read the buffer's
// previous group) and waited for by the model's stream before the group's first use.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/core/tensor.h"
#include "tutti/nn/flat_plan.h"
#include "tutti/nn/module.h"

namespace tutti::ddp {

class Zero3Parameters {
 public:
  // Makes the compute shard from master_shard (the f32 shard DDP keeps, filled already; also
  // the compute shard under f32 compute) and the resident buckets from bucket_values(b) (bucket
  // b's whole fp32 values, plan layout from its begin; asked for the resident buckets only, and
  // equal on every rank), then releases the model's parameters (FlatStorage::release_parameters).
  // groups: each parameter's gather group (gather_segments; "": resident). buffer_mb: each
  // gather buffer's size in MiB (0: the largest group's; a larger group is refused, naming it).
  // Refuses a layer that reads another module's parameter (nn::TiedLinear) of a group that is
  // not resident. prefetch: use() also gathers the next group (ShardParameters::prefetch).
  Zero3Parameters(Communicator& comm, nn::Module& model, const nn::FlatPlan& plan,
                  const std::vector<std::string>& groups, double buffer_mb, const Tensor& master_shard,
                  const std::function<Tensor(int bucket)>& bucket_values, bool prefetch = true);
  ~Zero3Parameters();
  Zero3Parameters(const Zero3Parameters&) = delete;
  Zero3Parameters& operator=(const Zero3Parameters&) = delete;

  // The param-use hook: bucket b is about to be read. Makes it whole (waits for its gather, or
  // gathers it now) and, with prefetch, gathers the next group (forward: in decreasing bucket
  // order, the order forward reaches them; backward: increasing).
  void use(int bucket);
  // The optimizer stepped: every shard changed. Gathers the resident buckets again and the
  // group in use (the first one the next forward reads), forgets the other buffer's.
  void after_step();
  // The shards were overwritten by a checkpoint (whole fp32 values `full`, plan layout, on the
  // CPU): refreshes the compute shard and the resident buckets, forgets the gathered groups.
  void load(const Tensor& full);
  // Waits for the resident gathers still in flight.
  void synchronize();

  // The compute shard (the gathers' source; where the optimizer writes the updated compute copy).
  const Tensor& compute_shard() const { return compute_shard_; }
  bool half() const { return half_; }
  // Bytes of the gather buffers and the resident buckets; of the compute shard when it is not
  // the master shard.
  std::int64_t gathered_bytes() const;
  std::int64_t compute_shard_bytes() const;
  // Gathers issued so far (for tests: prefetch and reuse).
  std::int64_t gathers_issued() const { return gathers_issued_; }
  // Host milliseconds spent waiting for gathers since the last call (StepStats::exposed_gather_ms:
  // what prefetch did not hide; on a GPU the host only issues a stream wait).
  double take_exposed_ms() {
    const double ms = exposed_ms_;
    exposed_ms_ = 0;
    return ms;
  }

 private:
  void gather_into(int bucket, int slot);
  void evict(int slot);
  void place(int bucket, const Tensor& whole);
  void wait(int bucket);
  int next_group(int bucket, bool forward) const;

  Communicator& comm_;
  nn::Module& model_;
  const nn::FlatPlan& plan_;
  std::vector<nn::Parameter*> params_;
  std::vector<bool> resident_;
  bool half_ = false;
  bool prefetch_ = true;
  Tensor compute_shard_;
  Tensor slots_[2];
  int slot_bucket_[2] = {-1, -1};
  std::vector<int> slot_of_;              // per bucket: its gather buffer, -1 when not whole (residents: -1)
  std::vector<Tensor> resident_buffers_;  // per bucket (undefined for the others)
  std::vector<Work> pending_;             // per bucket: its gather in flight
  int current_ = -1;                      // the group in use
  std::int64_t gathers_issued_ = 0;
  double exposed_ms_ = 0;
};

// Each parameter's gather group (group(name), or default_gather_group where group is empty)
// into `groups`, and the plan's segments (FlatPlanOptions::segments): one per run of
// consecutive parameters of one group. Refuses frozen parameters (naming the first).
std::vector<int> gather_segments(const std::vector<nn::PlanParam>& params,
                                 const std::function<std::string(const std::string&)>& group,
                                 std::vector<std::string>& groups);

// ZeRO-3 for a model with deferred parameters (nn::DeferredParameters): fills master_shard
// (this rank's shard, plan layout) one bucket at a time from the parameters' sources, never
// holding more than one bucket whole beside the resident ones. With `broadcast` only rank 0
// reads the sources and broadcasts each bucket (rank 0's values everywhere, as
// DdpOptions::broadcast_parameters promises); else every rank reads them. Returns the resident
// buckets' whole fp32 values (undefined for the others: see Zero3Parameters). Synchronizes.
std::vector<Tensor> shard_deferred_parameters(Communicator& comm, nn::Module& model, const nn::FlatPlan& plan,
                                              const std::vector<std::string>& groups, bool broadcast,
                                              const Tensor& master_shard);

// The gather group of a parameter by default (ShardParameters::gather_group unset): its name up to
// the first numeric component ("blocks.3.body.1.weight" -> "blocks.3"), "" when it has none.
std::string default_gather_group(const std::string& name);

}  // namespace tutti::ddp
