#include "ddp/zero3.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <string>

#include "tutti/core/error.h"
#include "tutti/core/trace.h"
#include "tutti/kernels/cast.h"
#include "tutti/nn/transformer.h"

namespace tutti::ddp {
namespace {

bool is_half(DType d) { return d == DType::f16 || d == DType::bf16; }

}  // namespace

std::string default_gather_group(const std::string& name) {
  std::size_t start = 0;
  while (start <= name.size()) {
    std::size_t end = name.find('.', start);
    if (end == std::string::npos) end = name.size();
    const bool numeric = end > start && std::all_of(name.begin() + static_cast<std::ptrdiff_t>(start),
                                                    name.begin() + static_cast<std::ptrdiff_t>(end),
                                                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    // A numeric last component is a parameter's own name, not a module's.
    if (numeric && end < name.size()) return name.substr(0, end);
    start = end + 1;
  }
  return "";
}

std::vector<int> gather_segments(const std::vector<nn::PlanParam>& params,
                                 const std::function<std::string(const std::string&)>& group,
                                 std::vector<std::string>& groups) {
  groups.clear();
  std::vector<int> segments;
  for (const nn::PlanParam& p : params) {
    TUTTI_CHECK_ARG(p.requires_grad,
                    "DistributedDataParallel: ShardParameters (ZeRO-3) does not support frozen parameters, and '",
                    p.name,
                    "' has requires_grad false (its gradient would have no shard to go to): train it, drop it from "
                    "the model, or use ShardGradients (ZeRO-2)");
    groups.push_back(group ? group(p.name) : default_gather_group(p.name));
    const bool same = !segments.empty() && groups.back() == groups[groups.size() - 2];
    segments.push_back(segments.empty() ? 0 : segments.back() + (same ? 0 : 1));
  }
  return segments;
}

namespace {

// Every TiedLinear's weight must be resident: it is read by a module that does not own it, so
// no param-use hook of its group fires there.
void check_tied(nn::Module& m, const std::vector<nn::Parameter*>& params, const std::vector<std::string>& groups) {
  if (const auto* tied = dynamic_cast<const nn::TiedLinear*>(&m)) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      TUTTI_CHECK_ARG(params[i] != &tied->weight() || groups[i].empty(),
                      "DistributedDataParallel: ShardParameters (ZeRO-3): '", params[i]->name, "' is read by a ",
                      tied->describe(), " that does not own it, so it must be ",
                      "in the resident group (ShardParameters::gather_group \"\"), not in group '", groups[i], "'");
    }
  }
  for (const auto& [name, child] : m.children()) check_tied(*child, params, groups);
}

}  // namespace

std::vector<Tensor> shard_deferred_parameters(Communicator& comm, nn::Module& model, const nn::FlatPlan& plan,
                                              const std::vector<std::string>& groups, bool broadcast,
                                              const Tensor& master_shard) {
  const std::vector<nn::Parameter*> params = model.parameters();
  const Stream& stream = model.stream();
  const bool reads = !broadcast || comm.rank() == 0;
  std::vector<Tensor> resident(plan.buckets.size());
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    const nn::PlanBucket& pb = plan.buckets[b];
    if (pb.entries.empty()) continue;
    Tensor whole = Tensor::zeros({pb.numel()}, DType::f32, model.device());  // the padding stays 0
    if (reads) {
      for (std::size_t i : pb.entries) {
        const nn::PlanEntry& e = plan.entries[i];
        Tensor view = whole.view(e.offset - pb.begin, e.shape);
        nn::fill_from_source(*params[i], view, stream);
      }
    }
    if (broadcast) {
      CallOptions call;
      call.stream = stream;
      call.label = "ddp parameter broadcast (deferred, group " + std::to_string(b) + ")";
      comm.broadcast(whole, 0, call).wait(stream);
    }
    if (pb.chunk > 0) {
      master_shard.view(pb.shard_offset, {pb.chunk})
          .copy_from(whole.view(pb.chunk_of(comm.rank()).begin - pb.begin, {pb.chunk}), stream);
    }
    if (groups[pb.entries.front()].empty()) resident[b] = whole;
    stream.synchronize();  // `whole` is freed next, unless resident
  }
  return resident;
}

Zero3Parameters::Zero3Parameters(Communicator& comm, nn::Module& model, const nn::FlatPlan& plan,
                                 const std::vector<std::string>& groups, double buffer_mb, const Tensor& master_shard,
                                 const std::function<Tensor(int bucket)>& bucket_values, bool prefetch)
    : comm_(comm),
      model_(model),
      plan_(plan),
      params_(model.parameters()),
      half_(is_half(model.compute_dtype())),
      prefetch_(prefetch) {
  check_tied(model_, params_, groups);
  const std::size_t nb = plan_.buckets.size();
  resident_.assign(nb, false);
  std::int64_t largest = 0;
  std::size_t largest_bucket = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    const nn::PlanBucket& pb = plan_.buckets[b];
    resident_[b] = !pb.entries.empty() && groups[pb.entries.front()].empty();
    if (!resident_[b] && pb.numel() > largest) {
      largest = pb.numel();
      largest_bucket = b;
    }
  }
  const std::int64_t element = static_cast<std::int64_t>(size_of(model_.compute_dtype()));
  std::int64_t buffer_numel = largest;
  if (buffer_mb > 0) {
    buffer_numel = static_cast<std::int64_t>(buffer_mb * 1024 * 1024) / element;
    TUTTI_CHECK_ARG(largest <= buffer_numel, "DistributedDataParallel: ShardParameters (ZeRO-3): gather group '",
                    groups[plan_.buckets[largest_bucket].entries.front()], "' holds ", largest, " elements (",
                    largest * element, " bytes with padding) but the gather buffers hold ", buffer_numel,
                    " (ShardParameters::gather_buffer_mb = ", buffer_mb,
                    "): raise gather_buffer_mb, set it to 0 (the largest group's size), or split the group "
                    "(ShardParameters::gather_group)");
  }
  slot_of_.assign(nb, -1);
  pending_.resize(nb);
  resident_buffers_.resize(nb);
  const Stream& stream = model_.stream();
  const DType dtype = model_.compute_dtype();
  // The compute copies are the masters cast (nn::FlatStorage), so the compute shard is the
  // master shard cast.
  if (half_) {
    compute_shard_ = Tensor::empty({plan_.shard_numel}, dtype, model_.device());
    kernels::cast(master_shard, compute_shard_, stream);
  } else {
    compute_shard_ = master_shard;
  }
  for (std::size_t b = 0; b < nb; ++b) {
    if (!resident_[b]) continue;
    const nn::PlanBucket& pb = plan_.buckets[b];
    const Tensor values = bucket_values(static_cast<int>(b));
    resident_buffers_[b] = Tensor::empty({pb.numel()}, dtype, model_.device());
    if (half_) {
      kernels::cast(values, resident_buffers_[b], stream);
    } else {
      resident_buffers_[b].copy_from(values, stream);
    }
  }
  for (Tensor& s : slots_) s = Tensor::zeros({std::max<std::int64_t>(buffer_numel, 1)}, dtype, model_.device());
  model_.storage().release_parameters();  // synchronizes: the copies above are done
  for (std::size_t b = 0; b < nb; ++b) {
    if (resident_[b]) place(static_cast<int>(b), resident_buffers_[b]);
  }
}

Zero3Parameters::~Zero3Parameters() {
  // Gathers in flight write the buffers: let them finish (their Works keep the storage alive too).
  for (Work& w : pending_) {
    try {
      w.wait();
    } catch (...) {
    }
  }
}

void Zero3Parameters::place(int bucket, const Tensor& whole) {
  const nn::PlanBucket& pb = plan_.buckets[static_cast<std::size_t>(bucket)];
  for (std::size_t i : pb.entries) {
    const nn::PlanEntry& e = plan_.entries[i];
    Tensor view = whole.defined() ? whole.view(e.offset - pb.begin, e.shape) : Tensor();
    (half_ ? params_[i]->compute : params_[i]->value) = view;
  }
}

void Zero3Parameters::gather_into(int bucket, int slot) {
  const auto b = static_cast<std::size_t>(bucket);
  const nn::PlanBucket& pb = plan_.buckets[b];
  const Tensor whole = resident_[b] ? resident_buffers_[b] : slots_[slot].view(0, {pb.numel()});
  if (!resident_[b]) {
    evict(slot);
    slot_bucket_[slot] = bucket;
    slot_of_[b] = slot;
    place(bucket, whole);
  }
  CallOptions call;
  call.stream = model_.stream();
  call.label = "zero3 gather " + std::to_string(bucket);
  pending_[b] = comm_.allgather(compute_shard_.view(pb.shard_offset, {pb.chunk}), whole, call);
  ++gathers_issued_;
}

void Zero3Parameters::evict(int slot) {
  const int old = slot_bucket_[slot];
  if (old < 0) return;
  // A gather still writing the buffer must land before another group's is issued into it.
  wait(old);
  place(old, Tensor());
  slot_of_[static_cast<std::size_t>(old)] = -1;
  slot_bucket_[slot] = -1;
  if (current_ == old) current_ = -1;
}

void Zero3Parameters::wait(int bucket) {
  Work& w = pending_[static_cast<std::size_t>(bucket)];
  if (w.info().seq == 0) return;  // none in flight
  const auto t0 = std::chrono::steady_clock::now();
  w.wait(model_.stream());
  const auto t1 = std::chrono::steady_clock::now();
  w = Work();
  exposed_ms_ += std::chrono::duration<double, std::milli>(t1 - t0).count();
  if (trace::on()) {
    using std::chrono::nanoseconds;
    trace::record("wait for parameters (group " + std::to_string(bucket) + ")", "wait", trace::Lane::host,
                  std::chrono::duration_cast<nanoseconds>(t0.time_since_epoch()).count(),
                  std::chrono::duration_cast<nanoseconds>(t1.time_since_epoch()).count());
  }
}

int Zero3Parameters::next_group(int bucket, bool forward) const {
  const int n = static_cast<int>(plan_.buckets.size());
  for (int b = forward ? bucket - 1 : bucket + 1; b >= 0 && b < n; b += forward ? -1 : 1) {
    if (!resident_[static_cast<std::size_t>(b)] && plan_.buckets[static_cast<std::size_t>(b)].numel() > 0) return b;
  }
  return -1;
}

void Zero3Parameters::use(int bucket) {
  const auto b = static_cast<std::size_t>(bucket);
  if (resident_[b]) {
    wait(bucket);
    return;
  }
  if (bucket == current_) return;  // whole and waited for
  if (slot_of_[b] < 0) {
    // Not whole: take the buffer that does not hold the group in use (done: we are past it).
    int slot = slot_bucket_[0] < 0 ? 0 : slot_bucket_[1] < 0 ? 1 : 0;
    if (current_ >= 0 && slot_bucket_[slot] == current_) slot = 1 - slot;
    gather_into(bucket, slot);
  }
  wait(bucket);
  current_ = bucket;
  // Prefetch the next group into the other buffer; its occupant (the group before) is done.
  if (!prefetch_) return;
  const int next = next_group(bucket, model_.awaiting_backward());
  if (next >= 0 && slot_of_[static_cast<std::size_t>(next)] < 0) gather_into(next, 1 - slot_of_[b]);
}

void Zero3Parameters::after_step() {
  for (int s = 0; s < 2; ++s) {
    const int b = slot_bucket_[s];
    if (b < 0) continue;
    if (b == current_) {
      gather_into(b, s);  // the next forward's first group, again (evict() then place() again)
      current_ = -1;      // use() must wait for it
    } else {
      evict(s);
    }
  }
  for (std::size_t b = 0; b < resident_.size(); ++b) {
    if (resident_[b]) gather_into(static_cast<int>(b), -1);
  }
}

void Zero3Parameters::load(const Tensor& full) {
  synchronize();
  for (int s = 0; s < 2; ++s) evict(s);
  current_ = -1;
  const Stream& stream = model_.stream();
  const int rank = comm_.rank();
  const Tensor values = full.to(model_.device(), stream);
  if (half_) {
    for (const nn::PlanBucket& pb : plan_.buckets) {
      if (pb.chunk == 0) continue;
      kernels::cast(values.view(pb.chunk_of(rank).begin, {pb.chunk}), compute_shard_.view(pb.shard_offset, {pb.chunk}),
                    stream);
    }
  }
  for (std::size_t b = 0; b < resident_.size(); ++b) {
    if (!resident_[b]) continue;
    const nn::PlanBucket& pb = plan_.buckets[b];
    if (half_) {
      kernels::cast(values.view(pb.begin, {pb.numel()}), resident_buffers_[b], stream);
    } else {
      resident_buffers_[b].copy_from(values.view(pb.begin, {pb.numel()}), stream);
    }
  }
  stream.synchronize();
}

void Zero3Parameters::synchronize() {
  for (std::size_t b = 0; b < pending_.size(); ++b) wait(static_cast<int>(b));
}

std::int64_t Zero3Parameters::gathered_bytes() const {
  std::int64_t bytes = 0;
  for (const Tensor& s : slots_) bytes += static_cast<std::int64_t>(s.nbytes());
  for (const Tensor& r : resident_buffers_) bytes += r.defined() ? static_cast<std::int64_t>(r.nbytes()) : 0;
  return bytes;
}

std::int64_t Zero3Parameters::compute_shard_bytes() const {
  return half_ ? static_cast<std::int64_t>(compute_shard_.nbytes()) : 0;
}

}  // namespace tutti::ddp
