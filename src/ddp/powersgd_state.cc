// PowerSGD's checkpoint state (tutti/ddp/powersgd.h, "Checkpoints"): the step count, the
// options that give the state its shapes and meaning, Q by parameter name, and every rank's
// error by rank and parameter name, gathered when saved; on load each rank takes its own.
#include <map>
#include <string>

#include "powersgd.h"
#include "tutti/core/error.h"

namespace tutti::ddp {
namespace {

constexpr const char* kStep = "step";       // finish() calls so far (the warm-up's count)
constexpr const char* kRanks = "ranks";     // the world size that wrote it
constexpr const char* kQDrawn = "q_drawn";  // 1: Q holds the last step's (a warm start continues it)
constexpr const char* kOptRank = "options.rank";
constexpr const char* kOptStart = "options.start_step";
constexpr const char* kOptRatio = "options.min_compression_ratio";  // f32
constexpr const char* kOptFeedback = "options.error_feedback";
constexpr const char* kOptWarm = "options.warm_start";
constexpr const char* kOptSeed = "options.seed";  // the u64's bits as i64

std::string q_key(const std::string& name) { return "q." + name; }
std::string error_key(int rank, const std::string& name) { return "rank" + std::to_string(rank) + ".error." + name; }

bool is_scalar_key(const std::string& key) {
  for (const char* k : {kStep, kRanks, kQDrawn, kOptRank, kOptStart, kOptRatio, kOptFeedback, kOptWarm, kOptSeed}) {
    if (key == k) return true;
  }
  return false;
}

const Tensor& entry(const StateDict& state, const std::string& key) {
  const auto it = state.find(key);
  TUTTI_CHECK_ARG(it != state.end(), "PowerSgdHook::load_state_dict: no entry '", key,
                  "' (the PowerSGD state is truncated)");
  return it->second;
}

std::int64_t integer(const StateDict& state, const std::string& key) {
  const Tensor& t = entry(state, key);
  TUTTI_CHECK_ARG(t.numel() == 1 && t.dtype() == DType::i64 && t.device().is_cpu(), "PowerSgdHook::load_state_dict: '",
                  key, "' is ", t.str(), ", not an i64 scalar");
  return t.to_ints()[0];
}

float real(const StateDict& state, const std::string& key) {
  const Tensor& t = entry(state, key);
  TUTTI_CHECK_ARG(t.numel() == 1 && t.dtype() == DType::f32 && t.device().is_cpu(), "PowerSgdHook::load_state_dict: '",
                  key, "' is ", t.str(), ", not an f32 scalar");
  return t.to_floats()[0];
}

}  // namespace

StateDict PowerSgd::state_dict(const nn::FlatPlan& plan, const Stream& stream) {
  // Q and the step count are the same on every rank, so each rank's result holds its own copy
  // and rank 0's is what a checkpoint keeps: the step counts finish() calls, which are
  // collective (every rank makes as many), and Q is either a draw, a function of (seed, step,
  // entry) only, or the result of the allreduce of Q, which gives every rank the same bits (the
  // promise DDP's replicated parameters rest on; tests/ddp/powersgd_checkpoint_test.cc checks
  // Q's bits across ranks). The error differs per rank: it is this rank's M minus the averaged
  // approximation.
  StateDict out;
  out[kStep] = int_scalar_tensor(step_);
  out[kRanks] = int_scalar_tensor(comm_.size());
  out[kOptRank] = int_scalar_tensor(options_.rank);
  out[kOptStart] = int_scalar_tensor(options_.start_step);
  out[kOptRatio] = scalar_tensor(options_.min_compression_ratio);
  out[kOptFeedback] = int_scalar_tensor(options_.error_feedback ? 1 : 0);
  out[kOptWarm] = int_scalar_tensor(options_.warm_start ? 1 : 0);
  out[kOptSeed] = int_scalar_tensor(static_cast<std::int64_t>(options_.seed));
  // Every bucket with matrices draws its Q at the same (first compressed) step.
  bool drawn = false;
  for (const Bucket& bucket : buckets_) drawn = drawn || (!bucket.matrices.empty() && bucket.q_drawn);
  out[kQDrawn] = int_scalar_tensor(drawn ? 1 : 0);
  for (const Bucket& bucket : buckets_) {
    for (const Matrix& x : bucket.matrices) {
      out[q_key(plan.entries[x.entry].name)] = bucket.q.view(x.q_offset, {x.m, x.r}).to(Device::cpu(), stream);
    }
  }
  if (options_.error_feedback) {
    // Bucket by bucket, so that a rank holds at most N copies of one bucket's error at a time.
    const int ranks = comm_.size(), me = comm_.rank();
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const Bucket& bucket = buckets_[b];
      if (bucket.matrices.empty()) continue;
      const std::int64_t e = bucket.error.numel();
      const Tensor all = Tensor::empty({ranks * e}, DType::f32, bucket.error.device());
      CallOptions call{"powersgd checkpoint error, bucket " + std::to_string(b), stream};
      comm_.allgather(bucket.error, all, call).wait(stream);
      // Rank 0 keeps every rank's error, the others their own.
      const int first = me == 0 ? 0 : me, last = me == 0 ? ranks : me + 1;
      const Tensor host = all.view(first * e, {(last - first) * e}).to(Device::cpu(), stream);
      stream.synchronize();  // before `all` goes, and before `host` is read
      for (int k = first; k < last; ++k) {
        for (const Matrix& x : bucket.matrices) {
          const nn::PlanEntry& pe = plan.entries[x.entry];
          out[error_key(k, pe.name)] = host.view((k - first) * e + x.e_offset, pe.shape);
        }
      }
    }
  }
  stream.synchronize();
  return out;
}

void PowerSgd::restart(const Stream& stream) {
  step_ = 0;
  for (Bucket& bucket : buckets_) {
    bucket.q_drawn = false;
    if (bucket.error.defined()) bucket.error.zero(stream);
  }
  stream.synchronize();
}

std::string PowerSgd::load_state_dict(const nn::FlatPlan& plan, const StateDict& state, const Stream& stream) {
  const std::string afresh =
      "PowerSGD starts afresh (" + std::to_string(options_.start_step) + " plain step(s), zero error, a new random Q)";
  if (state.empty()) {
    restart(stream);
    return "the checkpoint holds no PowerSGD state: " + afresh;
  }
  const std::int64_t step = integer(state, kStep), ranks = integer(state, kRanks), drawn = integer(state, kQDrawn);
  TUTTI_CHECK_ARG(step >= 0 && ranks >= 1 && (drawn == 0 || drawn == 1), "PowerSgdHook::load_state_dict: '", kStep,
                  "' ", step, ", '", kRanks, "' ", ranks, ", '", kQDrawn, "' ", drawn, " are not a PowerSGD state");
  // The options that decide which matrices are compressed, the shapes of their state and what it
  // means: another value restarts PowerSGD (its state would not fit, or mean something else).
  std::string other;
  auto compare = [&](const char* key, auto saved, auto mine) {
    if (other.empty() && saved != mine) {
      other = std::string(key) + " " + std::to_string(saved) + ", here " + std::to_string(mine);
    }
  };
  compare(kOptRank, integer(state, kOptRank), static_cast<std::int64_t>(options_.rank));
  compare(kOptStart, integer(state, kOptStart), static_cast<std::int64_t>(options_.start_step));
  compare(kOptRatio, real(state, kOptRatio), static_cast<float>(options_.min_compression_ratio));
  compare(kOptFeedback, integer(state, kOptFeedback), static_cast<std::int64_t>(options_.error_feedback));
  compare(kOptWarm, integer(state, kOptWarm), static_cast<std::int64_t>(options_.warm_start));
  compare(kOptSeed, integer(state, kOptSeed), static_cast<std::int64_t>(options_.seed));
  if (!other.empty()) {
    restart(stream);
    return "the checkpoint's PowerSGD state is of other options (" + other + "): " + afresh;
  }
  // The same options: every entry checked before anything changes. The entries are named by
  // parameter, so another bucket layout finds them alike.
  std::map<std::string, Shape> expected;
  for (const Bucket& bucket : buckets_) {
    for (const Matrix& x : bucket.matrices) {
      const nn::PlanEntry& pe = plan.entries[x.entry];
      expected[q_key(pe.name)] = {x.m, x.r};
      if (!options_.error_feedback) continue;
      for (int k = 0; k < ranks; ++k) expected[error_key(k, pe.name)] = pe.shape;
    }
  }
  for (const auto& [key, t] : state) {
    if (is_scalar_key(key)) continue;
    const auto it = expected.find(key);
    TUTTI_CHECK_ARG(it != expected.end(), "PowerSgdHook::load_state_dict: entry '", key,
                    "' is no matrix that PowerSGD compresses here (a checkpoint of another model?)");
    TUTTI_CHECK_ARG(t.shape() == it->second && t.dtype() == DType::f32, "PowerSgdHook::load_state_dict: '", key,
                    "' is ", t.str(), " but PowerSGD's is ", shape_str(it->second), " f32");
  }
  for (const auto& [key, shape] : expected) (void)entry(state, key);

  const bool same_world = ranks == comm_.size();
  step_ = static_cast<int>(step);
  for (Bucket& bucket : buckets_) {
    if (bucket.matrices.empty()) continue;
    bucket.q_drawn = drawn == 1;
    for (const Matrix& x : bucket.matrices) {
      const nn::PlanEntry& pe = plan.entries[x.entry];
      bucket.q.view(x.q_offset, {x.m, x.r}).copy_from(state.at(q_key(pe.name)), stream);
      if (!bucket.error.defined()) continue;
      Tensor err = bucket.error.view(x.e_offset, {x.n * x.m});
      if (same_world) {
        err.copy_from(state.at(error_key(comm_.rank(), pe.name)), stream);
      } else {
        err.zero(stream);
      }
    }
  }
  stream.synchronize();  // the caller's host tensors may go on return
  if (same_world || !options_.error_feedback) return "";
  return "the PowerSGD state was written on " + std::to_string(ranks) + " rank(s), here " +
         std::to_string(comm_.size()) + ": its step count and Q are kept, the error feedback starts at zero";
}

}  // namespace tutti::ddp
