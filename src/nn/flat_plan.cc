#include "tutti/nn/flat_plan.h"

#include <algorithm>
#include <sstream>

#include "tutti/core/error.h"

namespace tutti::nn {
namespace {

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

FlatPlan make_flat_plan(const std::vector<PlanParam>& params, const FlatPlanOptions& options) {
  TUTTI_CHECK_ARG(options.align_elements >= 1, "make_flat_plan: align_elements must be >= 1, got ",
                  options.align_elements);
  TUTTI_CHECK_ARG(options.bucket_cap_mb > 0 && options.first_bucket_cap_mb > 0,
                  "make_flat_plan: bucket caps must be positive, got bucket_cap_mb=", options.bucket_cap_mb,
                  " first_bucket_cap_mb=", options.first_bucket_cap_mb);
  TUTTI_CHECK_ARG(options.world_size >= 1, "make_flat_plan: world_size must be >= 1, got ", options.world_size);
  TUTTI_CHECK_ARG(options.grad_element_bytes >= 1, "make_flat_plan: grad_element_bytes must be >= 1");
  TUTTI_CHECK_ARG(options.segments.empty() || options.segments.size() == params.size(),
                  "make_flat_plan: ", options.segments.size(), " segment id(s) for ", params.size(), " parameter(s)");
  FlatPlan plan;
  plan.options = options;
  const std::size_t n = params.size();
  plan.entries.resize(n);
  const std::int64_t align = options.align_elements;
  // A bucket's length is a multiple of this, so that every rank's chunk is aligned too.
  const std::int64_t bucket_multiple = align * options.world_size;
  const double elem = static_cast<double>(options.grad_element_bytes);
  double cap_bytes = options.first_bucket_cap_mb * 1024 * 1024;

  PlanBucket current;
  std::int64_t end = 0;  // end of the last parameter placed
  auto close_bucket = [&] {
    current.end = current.begin + round_up(end - current.begin, bucket_multiple);
    current.chunk = current.numel() / options.world_size;
    current.shard_offset = plan.shard_numel;
    plan.shard_numel += current.chunk;
    end = current.end;
    plan.buckets.push_back(std::move(current));
    current = PlanBucket();
    cap_bytes = options.bucket_cap_mb * 1024 * 1024;
  };
  // Reverse order: backward writes the last layers' gradients first, so they go in the first
  // bucket and its reduction can start while earlier layers are still computing.
  for (std::size_t k = n; k-- > 0;) {
    const PlanParam& p = params[k];
    PlanEntry& e = plan.entries[k];
    e.name = p.name;
    e.shape = p.shape;
    e.numel = numel_of(p.shape);
    e.requires_grad = p.requires_grad;
    std::int64_t start = round_up(end, align);
    const bool new_segment = !current.entries.empty() && !options.segments.empty() &&
                             options.segments[k] != options.segments[current.entries.back()];
    const bool full = new_segment || (!current.entries.empty() &&
                                      static_cast<double>(start + e.numel - current.begin) * elem > cap_bytes);
    if (full) {
      close_bucket();
      start = end;
    }
    if (current.entries.empty()) current.begin = start;
    e.offset = start;
    e.bucket = static_cast<int>(plan.buckets.size());
    end = start + e.numel;
    current.entries.push_back(k);
  }
  if (!current.entries.empty()) close_bucket();
  plan.total = end;
  return plan;
}

std::vector<PlanParam> plan_params(const std::vector<Parameter*>& params) {
  std::vector<PlanParam> specs;
  specs.reserve(params.size());
  for (const Parameter* p : params) specs.push_back({p->name, p->shape(), p->requires_grad});
  return specs;
}

FlatPlan make_flat_plan(const std::vector<Parameter*>& params, const FlatPlanOptions& options) {
  return make_flat_plan(plan_params(params), options);
}

ElementRange FlatPlan::owned_part(const PlanEntry& e, int rank) const {
  const ElementRange chunk = buckets.at(static_cast<std::size_t>(e.bucket)).chunk_of(rank);
  const std::int64_t begin = std::max(chunk.begin, e.offset);
  return {begin, std::max(begin, std::min(chunk.end, e.offset + e.numel))};
}

std::vector<ElementRange> FlatPlan::shard_ranges(int rank) const {
  TUTTI_CHECK_ARG(rank >= 0 && rank < world_size(), "FlatPlan::shard_ranges: rank ", rank, " of a plan for ",
                  world_size(), " rank(s)");
  std::vector<ElementRange> out;
  out.reserve(buckets.size());
  for (const PlanBucket& b : buckets) out.push_back(b.chunk_of(rank));
  return out;
}

std::string FlatPlan::describe() const {
  std::ostringstream s;
  s << "plan of " << entries.size() << " parameter(s), " << total << " elements, " << buckets.size() << " bucket(s), "
    << world_size() << " shard(s) of " << shard_numel << "\n";
  for (const PlanEntry& e : entries) {
    s << "  " << e.name << " " << shape_str(e.shape) << " at " << e.offset << " in bucket " << e.bucket
      << (e.requires_grad ? "" : " (frozen)") << "\n";
  }
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    s << "  bucket " << b << " [" << buckets[b].begin << ", " << buckets[b].end << ") chunk " << buckets[b].chunk
      << "\n";
  }
  return s.str();
}

bool FlatPlan::operator==(const FlatPlan& o) const {
  if (total != o.total || shard_numel != o.shard_numel || world_size() != o.world_size() ||
      entries.size() != o.entries.size() || buckets.size() != o.buckets.size()) {
    return false;
  }
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const PlanEntry &a = entries[i], &b = o.entries[i];
    if (a.name != b.name || a.shape != b.shape || a.offset != b.offset || a.bucket != b.bucket ||
        a.requires_grad != b.requires_grad) {
      return false;
    }
  }
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (buckets[i].begin != o.buckets[i].begin || buckets[i].end != o.buckets[i].end) return false;
  }
  return true;
}

void FlatPlan::check_matches(const std::vector<Parameter*>& params, const char* what) const {
  TUTTI_CHECK_ARG(params.size() == entries.size(), what, ": the plan has ", entries.size(),
                  " parameter(s) but the model ", params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    TUTTI_CHECK_ARG(params[i]->name == entries[i].name && params[i]->shape() == entries[i].shape, what, ": parameter #",
                    i, " is '", params[i]->name, "' ", shape_str(params[i]->shape()), " but the plan has '",
                    entries[i].name, "' ", shape_str(entries[i].shape), " (a plan made for another model?)");
  }
}

}  // namespace tutti::nn
