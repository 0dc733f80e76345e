#include "tutti/train/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

#include "core/format_bytes.h"
#include "train/plan_layout.h"
#include "tutti/core/error.h"
#include "tutti/ddp/memory.h"
#include "tutti/nn/flat_plan.h"

namespace tutti::train {

using tutti::detail::format_count;

using models::GptConfig;
using models::LlamaConfig;
using models::Recompute;

using detail::Body;
using detail::BodyBuffer;
using detail::DecoderLayout;
using detail::human;

// "0.12 MiB", "2.90 GiB": the table's unit.
std::string detail::human(std::int64_t bytes) {
  return tutti::detail::format_bytes(static_cast<double>(bytes), 2, tutti::detail::ByteUnit::MiB);
}

int detail::optimizer_states(const PlanOptions& o) {
  return o.optimizer == PlanOptions::Optimizer::adamw ? 2 : o.optimizer == PlanOptions::Optimizer::sgd_momentum ? 1 : 0;
}

ddp::MemoryPrediction detail::predict_ddp(std::vector<nn::PlanParam> params, std::vector<GradEvent> backward_order,
                                          std::function<std::string(const std::string&)> gather_group,
                                          std::string resident, const PlanOptions& o) {
  TUTTI_CHECK_ARG(is_floating(o.compute) && (o.grad == DType::f32 || o.grad == o.compute) && is_floating(o.grad_comm),
                  "memory_plan: compute ", name_of(o.compute), ", gradients ", name_of(o.grad), ", comm ",
                  name_of(o.grad_comm), ": gradients are f32 or the compute dtype");
  ddp::DdpOptions ddp_options;
  ddp_options.bucket_cap_mb = o.bucket_cap_mb;
  ddp_options.first_bucket_cap_mb = o.first_bucket_cap_mb;
  ddp_options.sharding = ddp::sharding_of_stage(o.zero_stage, std::move(gather_group));
  if (o.deterministic) ddp_options.deterministic = ddp::DeterministicOptions{};
  ddp::MemoryInputs in;
  in.params = std::move(params);
  in.world_size = o.world_size / o.tensor_parallel;  // DDP's: the data-parallel ranks
  in.compute = o.compute;
  in.grad = o.grad;
  in.grad_comm = o.grad_comm;
  in.optimizer_states = optimizer_states(o);
  in.backward_order = std::move(backward_order);
  in.resident = std::move(resident);
  return ddp::predict_memory(ddp_options, in);
}

MemoryPlan detail::plan_decoder(const DecoderLayout& d, const PlanOptions& o) {
  TUTTI_CHECK_ARG(
      o.recompute.mode != Recompute::Mode::every || (o.recompute.every >= 1 && o.recompute.every <= d.layers),
      "memory_plan: ", o.recompute.str(), " but ", d.fingerprint, " has ", d.layers, " layers");
  TUTTI_CHECK_ARG(!(o.cpu && o.gpu),
                  "memory_plan: PlanOptions::cpu and ::gpu are both set: the device is one or the other");
  const std::int64_t L = d.layers;

  // DistributedDataParallel's part: the plan, the parameters and masters, ZeRO-3's gathered
  // groups, the gradients, the optimizer's state and the communication buffers.
  const ddp::MemoryPrediction held = predict_ddp(d.params, d.backward_order, d.gather_group, d.resident, o);
  const int states = optimizer_states(o);
  const nn::FlatPlan& plan = held.plan;
  const std::int64_t total = plan.total, shard = held.sharded ? plan.shard_numel : plan.total;

  MemoryPlan m;
  m.parameters = d.parameters;
  m.flat_total = total;
  m.shard = shard;
  m.buckets = static_cast<int>(plan.buckets.size());
  auto row = [&](std::string name, std::int64_t bytes, std::string detail) {
    m.rows.push_back({std::move(name), bytes, std::move(detail)});
  };
  for (const ddp::MemoryLine& line : held.lines) row(line.name, line.bytes, line.detail);
  const std::int64_t T = o.seq_len, B = o.micro_batch, N = B * T;
  row("batch", o.batch_on_device ? 2 * N * 4 : 0,
      "tokens and targets, " + std::to_string(B) + " x " + std::to_string(T) + " i32 each");

  // Activations: every layer's reusable buffers (Module::buffer), forward's and backward's; a
  // checkpointed block keeps only its residual's (y and dx, its own also when checkpointed).
  const std::int64_t attn_body = d.attention.bytes(), mlp_body = d.mlp.bytes();
  bool attn_ckpt = false, mlp_ckpt = false;
  std::int64_t attn_blocks = 0;  // checkpointed attention blocks
  std::int64_t act = d.outside_bytes;
  for (std::int64_t l = 0; l < L; ++l) {
    const bool a = o.recompute.checkpoints(l, false), p = o.recompute.checkpoints(l, true);
    attn_ckpt = attn_ckpt || a;
    attn_blocks += a ? 1 : 0;
    mlp_ckpt = mlp_ckpt || p;
    act += d.residual_bytes * 2 + (a ? 0 : attn_body) + (p ? 0 : mlp_body);
  }
  m.layer_bytes_kept = 2 * d.residual_bytes + attn_body + mlp_body;
  m.layer_bytes_checkpointed = 2 * d.residual_bytes;
  row("activations", act,
      std::to_string(L) + " layers: " + human(m.layer_bytes_kept) + " each kept" +
          (attn_ckpt || mlp_ckpt
               ? ", " + human(m.layer_bytes_checkpointed) + " each checkpointed (" + o.recompute.str() + ")"
               : "") +
          "; " + d.outside_detail);
  // The shared workspace of the checkpointed bodies (CausalLm::set_recompute): per position in the
  // body and slot, the largest buffer of the kinds checkpointed.
  std::vector<std::pair<int, int>> keys;
  for (const Body* body : {&d.attention, &d.mlp})
    for (const BodyBuffer& b : body->buffers)
      if (std::find(keys.begin(), keys.end(), std::pair{b.position, b.slot}) == keys.end())
        keys.emplace_back(b.position, b.slot);
  std::int64_t ws = 0;
  for (const auto& [pos, slot] : keys)
    ws += std::max(attn_ckpt ? d.attention.at(pos, slot) : 0, mlp_ckpt ? d.mlp.at(pos, slot) : 0);
  std::string ws_detail = ws ? "one body's buffers, shared by the checkpointed blocks" : "no recomputation";
  if (attn_ckpt && mlp_ckpt) {
    // The first step grows a workspace slot where the MLP body needs more than the attention body
    // (Module::buffer reallocates); the attention's old buffer stays alive while the attention
    // modules that keep a handle on it (an input, a saved statistic) still do, that is until layer
    // 0's attention block recomputes, last in backward. (And likewise an MLP buffer that a larger
    // attention one replaces.) Allocated only after that: the residual's input gradient and, when
    // no other attention block checkpoints, the attention's backward buffers the MLP has not
    // already grown.
    std::int64_t superseded = 0, after = d.residual_bytes / 2;
    for (const auto& [pos, slot] : keys) {
      const std::int64_t a = d.attention.at(pos, slot), p = d.mlp.at(pos, slot);
      for (const BodyBuffer& b : d.attention.buffers)
        if (b.position == pos && b.slot == slot && b.held && p > a) superseded += a;
      for (const BodyBuffer& b : d.mlp.buffers)
        if (b.position == pos && b.slot == slot && b.held && a > p) superseded += p;
      for (const BodyBuffer& b : d.attention.buffers)
        if (b.position == pos && b.slot == slot && !b.forward && attn_blocks == 1)
          after += std::max<std::int64_t>(0, a - p);
    }
    m.first_step_extra = std::max<std::int64_t>(0, superseded - after);
    ws += m.first_step_extra;
    ws_detail += ", + the first step's superseded buffers (" + human(superseded) + ") until layer 0 recomputes";
  }
  row("recompute workspace", ws, ws_detail);
  if (d.sequence_bytes > 0) row("sequence workspace", d.sequence_bytes, d.sequence_detail);
  row("logits", d.logits_bytes, d.logits_detail);
  row("workspace", 16, "scalars: the loss, the reducer's flag, the gradient norm");
  if (o.gpu) row("GPU kernel scratch", d.gpu_scratch, d.gpu_scratch_detail);
  if (o.evaluation) {
    m.rows.push_back({"evaluation", d.eval_bytes,
                      "between steps: the evaluating loss's logits gradient, the targets, scalars", true});
  }
  // model_state_dict: with ZeRO's f32 shards a gather of the values whole (on the CPU its views
  // are the state dict); otherwise a host copy of each parameter, which on a GPU is not the
  // device's memory.
  // A rank's parameters (with tensor parallelism its slices; m.parameters is the whole model's).
  std::int64_t rank_parameters = 0;
  for (const nn::PlanParam& p : d.params) rank_parameters += numel_of(p.shape);
  const bool gathers = held.gathers_values;
  const std::int64_t values_whole = gathers ? total * 4 : o.cpu ? rank_parameters * 4 : 0;
  const std::string values_detail = gathers ? "the f32 values gathered whole"
                                    : o.cpu ? "a copy of the f32 values (host memory is the device's)"
                                            : "nothing on the device (the values are whole on every rank)";
  // With tensor parallelism a state dict is then gathered whole over the group
  // (parallel::whole_state_dict): the split entries in key order, in batches of at most 64 MiB of
  // this rank's slices (a larger tensor alone), each copied into one flat tensor and allgathered
  // (tp x) on the device, then cut into whole tensors on the host, which the returned dict keeps.
  // gather(k) is the peak of gathering the model's split entries (k = 0) or an optimizer state's
  // k entries per split parameter, above what was held before: at the end of a batch.
  const std::int64_t tp = o.tensor_parallel;
  std::int64_t split_elements = 0;
  for (std::size_t i = 0; i < d.params.size(); ++i)
    if (d.split[i]) split_elements += numel_of(d.params[i].shape);
  const auto gather = [&](int per_parameter) {
    constexpr std::int64_t kBatchBytes = 64 << 20;  // tensor_parallel.cc's
    std::map<std::string, std::int64_t> split;      // the state dict's order
    for (std::size_t i = 0; i < d.params.size(); ++i) {
      if (!d.split[i]) continue;
      for (int k = 0; k < std::max(per_parameter, 1); ++k)
        split[d.params[i].name + (per_parameter > 0 ? "." + std::to_string(k) : "")] = numel_of(d.params[i].shape);
    }
    std::vector<std::int64_t> batches{0};
    for (const auto& [name, n] : split) {
      if (batches.back() > 0 && (batches.back() + n) * 4 > kBatchBytes) batches.push_back(0);
      batches.back() += n;
    }
    std::int64_t peak = 0, before = 0;  // before: the elements of the earlier batches
    for (const std::int64_t b : batches) {
      const std::int64_t wholes = o.cpu ? tp * (before + b) * 4 : 0;  // on a GPU they are host memory
      peak = std::max(peak, wholes + (1 + tp) * b * 4);
      before += b;
    }
    return peak;
  };
  const std::string gather_detail =
      "; then whole_state_dict over the tp group: this rank's slices and the tp x "
      "gathered batch" +
      std::string(o.cpu ? ", and the whole tensors (host memory is the device's)" : "");
  if (o.state_dict && tp == 1) {
    m.rows.push_back({"state dict", values_whole, "between steps: model_state_dict: " + values_detail, true});
  } else if (o.state_dict) {
    // On a GPU the values (ZeRO's gather) are let go before the gather; on the CPU they are the dict.
    const std::int64_t bytes = o.cpu ? values_whole + gather(0) : std::max(values_whole, gather(0));
    m.rows.push_back({"state dict", bytes, "between steps: model_state_dict: " + values_detail + gather_detail, true});
  }
  if (o.checkpoint != PlanOptions::Checkpoint::none) {
    // io::CheckpointWriter's format: each tensor at a 64-byte aligned offset; the optimizer's
    // state is whole in the file whatever the stage.
    MemoryRow r{"checkpoint", 0, "", true};
    if (tp > 1) {
      // train::Run with State::tensor_parallel (checkpointing.cc): the rank's model and optimizer
      // state dicts (ZeRO: gathered over the data-parallel ranks), then each gathered whole over
      // the tp group, the model's wholes kept while the optimizer's are gathered; rank 0 hands
      // them to the writer. On a GPU only the gathers' batches (and ZeRO's) are device memory.
      const bool zero = held.sharded;
      const std::int64_t optimizer_copy = states * (zero ? total : rank_parameters) * 4;
      if (o.cpu) {
        r.bytes = values_whole + optimizer_copy +
                  std::max(gather(0), tp * split_elements * 4 + (states > 0 ? gather(states) : 0));
      } else {
        // A GPU backend lets go of a finished collective's tensors when its watchdog next polls
        // (every 20 ms): the model's batches may still be held while the optimizer's gather, so
        // both count (an upper bound; the measured peak is between the larger and the sum).
        const bool gathered = held.gathers_optimizer_state || gathers;
        r.bytes = std::max(gathered ? total * 4 : 0, gather(0) + (states > 0 ? gather(states) : 0));
      }
      r.detail = "between steps, until written: the model's and " + std::to_string(states) +
                 " optimizer state(s) of this rank" + gather_detail;
    } else if (!o.cpu) {
      // One rank's ZeRO has nothing to gather but the f32 masters of half precision or ZeRO-3.
      const bool gathered = held.gathers_optimizer_state || gathers;
      r.bytes = gathered ? total * 4 : 0;
      r.detail = gathered ? "between steps: the state gathered whole, one f32 vector at a time"
                          : "between steps: nothing on the device (the writer copies to host memory)";
    } else if (held.sharded) {
      r.bytes = values_whole + states * total * 4;
      r.detail = "between steps, until written: " + values_detail + " and " + std::to_string(states) +
                 " optimizer state(s) gathered whole";
    } else if (o.checkpoint == PlanOptions::Checkpoint::async) {
      r.bytes = (1 + states) * m.parameters * 4 + 64 * static_cast<std::int64_t>(d.params.size()) * (1 + states);
      r.kept = true;
      r.detail = "kept from the first checkpoint on: the async writer's buffers, the f32 values and " +
                 std::to_string(states) + " optimizer state(s)";
    } else {
      r.detail = "between steps: nothing (the sync writer writes the live tensors)";
    }
    m.rows.push_back(std::move(r));
  }
  return m;
}

namespace {

// The options checked and the sequence length settled (0: the context).
PlanOptions settled(const PlanOptions& o, std::int64_t context) {
  PlanOptions s = o;
  if (s.seq_len == 0) s.seq_len = context;
  TUTTI_CHECK_ARG(s.world_size >= 1 && s.zero_stage >= 0 && s.zero_stage <= 3 && s.micro_batch >= 1 && s.seq_len >= 1 &&
                      s.seq_len <= context,
                  "memory_plan: world_size ", s.world_size, " (>= 1), zero_stage ", s.zero_stage,
                  " (0-3), micro_batch ", s.micro_batch, " (>= 1) and seq_len ", s.seq_len, " (1 to the context ",
                  context, ") are out of range");
  TUTTI_CHECK_ARG(s.tensor_parallel >= 1 && s.world_size % s.tensor_parallel == 0, "memory_plan: tensor_parallel ",
                  s.tensor_parallel, " must be >= 1 and divide world_size ", s.world_size);
  TUTTI_CHECK_ARG(!s.sequence_parallel || s.tensor_parallel > 1,
                  "memory_plan: sequence_parallel splits the rows over the tensor-parallel group: tensor_parallel "
                  "must be 2 or more");
  return s;
}

}  // namespace

MemoryPlan memory_plan(const GptConfig& config, const PlanOptions& options) {
  const PlanOptions o = settled(options, config.context);
  return detail::plan_decoder(detail::gpt_layout(config, o), o);
}

MemoryPlan memory_plan(const LlamaConfig& config, const PlanOptions& options) {
  const PlanOptions o = settled(options, config.context);
  return detail::plan_decoder(detail::llama_layout(config, o), o);
}

std::int64_t MemoryPlan::step_total() const {
  std::int64_t n = 0;
  for (const MemoryRow& r : rows) n += r.between_steps ? 0 : r.bytes;
  return n;
}

std::int64_t MemoryPlan::total() const {
  std::int64_t kept = 0, between = 0;
  for (const MemoryRow& r : rows) {
    if (r.kept)
      kept += r.bytes;
    else if (r.between_steps)
      between = std::max(between, r.bytes);
  }
  return std::max(step_total(), step_total() - first_step_extra + kept + between);
}

std::int64_t MemoryPlan::bytes(const std::string& name) const {
  for (const MemoryRow& r : rows) {
    if (r.name == name) return r.bytes;
  }
  return 0;
}

std::string MemoryPlan::str() const {
  std::ostringstream s;
  char line[512];
  bool between = false;
  for (const MemoryRow& r : rows) {
    if (r.between_steps && !between) {
      std::snprintf(line, sizeof line, "  %-22s %12s\n", "step total", human(step_total()).c_str());
      s << line;
      between = true;
    }
    std::snprintf(line, sizeof line, "  %-22s %12s  %s\n", r.name.c_str(), human(r.bytes).c_str(), r.detail.c_str());
    s << line;
  }
  const bool any_kept = std::any_of(rows.begin(), rows.end(), [](const MemoryRow& r) { return r.kept && r.bytes > 0; });
  std::snprintf(line, sizeof line, "  %-22s %12s  (%s bytes)%s\n", "total", human(total()).c_str(),
                format_count(total()).c_str(),
                total() == step_total() ? ""
                : any_kept ? ": after the first step, with the kept row and the largest other between-step row"
                           : ": after the first step, with the largest between-step row");
  s << line;
  return s.str();
}

namespace detail {

std::int64_t largest_micro_batch(const std::function<MemoryPlan(const PlanOptions&)>& plan, PlanOptions options,
                                 std::int64_t device_bytes, std::int64_t limit) {
  // The total grows with the micro-batch: bisect.
  auto fits = [&](std::int64_t b) {
    options.micro_batch = b;
    return plan(options).total() <= device_bytes;
  };
  if (!fits(1)) return 0;
  std::int64_t lo = 1, hi = limit;
  if (fits(hi)) return hi;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::string fit_advice(const std::function<MemoryPlan(const PlanOptions&)>& plan, const PlanOptions& options,
                       std::int64_t device_bytes) {
  const std::int64_t now = plan(options).total();
  if (now <= device_bytes) return "";
  std::ostringstream s;
  s << "does not fit: " << human(now) << " per rank, " << human(device_bytes)
    << " available. To fit, change one or more of:\n";
  auto option = [&](const std::string& what, const PlanOptions& o) {
    const std::int64_t t = plan(o).total();
    s << "  - " << what << ": " << human(t) << (t <= device_bytes ? " (fits)" : " (still too large)") << "\n";
  };
  const std::int64_t b = largest_micro_batch(plan, options, device_bytes, options.micro_batch);
  if (b >= 1) {
    PlanOptions o = options;
    o.micro_batch = b;
    option("a micro-batch of " + std::to_string(b) + " sequence(s) per rank (more --accum-steps keep the batch)", o);
  } else {
    s << "  - a smaller micro-batch: not even 1 sequence per rank fits as configured\n";
  }
  if (options.recompute.mode != Recompute::Mode::blocks) {
    PlanOptions o = options;
    o.recompute = Recompute::parse("blocks");
    option("--recompute blocks (every block recomputes its forward)", o);
  }
  if (options.zero_stage < 3) {
    PlanOptions o = options;
    o.zero_stage = options.zero_stage + 1;
    option("--zero " + std::to_string(o.zero_stage), o);
  }
  PlanOptions o = options;
  o.world_size = options.world_size * 2;
  o.micro_batch = std::max<std::int64_t>(1, options.micro_batch / 2);
  option(std::to_string(o.world_size) + " ranks (the same global micro-batch: " + std::to_string(o.micro_batch) +
             " per rank" + (options.zero_stage > 0 ? ", smaller shards" : "") + ")",
         o);
  // Together: the least this many ranks can hold.
  PlanOptions least = options;
  least.micro_batch = 1;
  least.recompute = Recompute::parse("blocks");
  least.zero_stage = 3;
  option("all at once (1 sequence per rank, --recompute blocks, --zero 3)", least);
  return s.str();
}

}  // namespace detail

std::int64_t largest_micro_batch(const GptConfig& config, PlanOptions options, std::int64_t device_bytes,
                                 std::int64_t limit) {
  return detail::largest_micro_batch([&](const PlanOptions& o) { return memory_plan(config, o); }, options,
                                     device_bytes, limit);
}

std::int64_t largest_micro_batch(const LlamaConfig& config, PlanOptions options, std::int64_t device_bytes,
                                 std::int64_t limit) {
  return detail::largest_micro_batch([&](const PlanOptions& o) { return memory_plan(config, o); }, options,
                                     device_bytes, limit);
}

std::string fit_advice(const GptConfig& config, const PlanOptions& options, std::int64_t device_bytes) {
  return detail::fit_advice([&](const PlanOptions& o) { return memory_plan(config, o); }, options, device_bytes);
}

std::string fit_advice(const LlamaConfig& config, const PlanOptions& options, std::int64_t device_bytes) {
  return detail::fit_advice([&](const PlanOptions& o) { return memory_plan(config, o); }, options, device_bytes);
}

std::int64_t parse_bytes(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    TUTTI_THROW(InvalidArgument, "bytes '", text, "': expected a number and a unit, e.g. 141GB or 80GiB");
  }
  std::string unit;
  for (std::size_t i = used; i < text.size(); ++i) {
    if (!std::isspace(static_cast<unsigned char>(text[i]))) unit += static_cast<char>(std::tolower(text[i]));
  }
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  if (unit == "kb") scale = 1e3;
  if (unit == "mb") scale = 1e6;
  if (unit == "gb") scale = 1e9;
  if (unit == "tb") scale = 1e12;
  if (unit == "kib") scale = 1024.0;
  if (unit == "mib") scale = 1024.0 * 1024;
  if (unit == "gib") scale = 1024.0 * 1024 * 1024;
  if (unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  TUTTI_CHECK_ARG(scale > 0 && value > 0 && std::isfinite(value), "bytes '", text,
                  "': expected a positive number and B, KB, MB, GB, TB, KiB, MiB, GiB or TiB");
  return static_cast<std::int64_t>(std::llround(value * scale));
}

}  // namespace tutti::train
