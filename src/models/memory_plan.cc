#include "tutti/models/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/format_bytes.h"
#include "tutti/core/error.h"
#include "tutti/nn/flat_plan.h"

namespace tutti::models {

namespace {

std::int64_t bytes_of(DType d) { return static_cast<std::int64_t>(size_of(d)); }

// "1,234,567".
std::string grouped(std::int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string s = n < 0 ? "-" : "";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

// "0.12 MiB", "2.90 GiB": the table's unit.
std::string human(std::int64_t bytes) {
  return detail::format_bytes(static_cast<double>(bytes), 2, detail::ByteUnit::MiB);
}

// The Gpt's parameters as Gpt registers them (gpt.h lists the names): what its flat plan cuts.
std::vector<nn::PlanParam> gpt_params(const GptConfig& c) {
  const std::int64_t C = c.width;
  std::vector<nn::PlanParam> p;
  p.push_back({"embed.wte", {c.padded_vocab, C}, true});
  p.push_back({"embed.wpe", {c.context, C}, true});
  for (std::int64_t l = 0; l < c.layers; ++l) {
    for (const std::int64_t wide : {3 * C, 4 * C}) {  // attention's Linear(C, 3C), the MLP's Linear(C, 4C)
      const std::string block = "blocks." + std::to_string(2 * l + (wide == 4 * C ? 1 : 0)) + ".body.";
      p.push_back({block + "0.gamma", {C}, true});
      p.push_back({block + "0.beta", {C}, true});
      p.push_back({block + "1.weight", {wide, C}, true});
      p.push_back({block + "1.bias", {wide}, true});
      p.push_back({block + "3.weight", {C, wide == 4 * C ? 4 * C : C}, true});
      p.push_back({block + "3.bias", {C}, true});
    }
  }
  p.push_back({"ln_f.gamma", {C}, true});
  p.push_back({"ln_f.beta", {C}, true});
  return p;
}

// ZeRO-2's pool of bucket buffers (Reducer::acquire_slot): how many the backward pass needs,
// replaying the order in which the layers place (grad_of) and report (grad_ready) gradients.
int zero2_slots(const GptConfig& c, const nn::FlatPlan& plan) {
  const int nb = static_cast<int>(plan.buckets.size());
  std::vector<int> slots;  // bucket held by each slot, -1 free
  std::vector<int> slot_of(static_cast<std::size_t>(nb), -1);
  std::vector<bool> launched(static_cast<std::size_t>(nb), false);
  std::vector<std::int64_t> pending(static_cast<std::size_t>(nb), 0);
  for (const nn::PlanBucket& b : plan.buckets) {
    pending[static_cast<std::size_t>(&b - plan.buckets.data())] = static_cast<std::int64_t>(b.entries.size());
  }
  int next = 0;
  auto bucket = [&](std::size_t i) { return static_cast<std::size_t>(plan.entries[i].bucket); };
  auto place = [&](std::size_t i) {
    const std::size_t b = bucket(i);
    if (slot_of[b] >= 0) return;
    int chosen = -1;
    for (std::size_t s = 0; s < slots.size() && chosen < 0; ++s) {
      if (slots[s] < 0) chosen = static_cast<int>(s);
    }
    if (chosen < 0) {  // the earliest launched bucket gives its buffer back
      for (std::size_t s = 0; s < slots.size(); ++s) {
        if (launched[static_cast<std::size_t>(slots[s])] &&
            (chosen < 0 || slots[s] < slots[static_cast<std::size_t>(chosen)])) {
          chosen = static_cast<int>(s);
        }
      }
      if (chosen >= 0) slot_of[static_cast<std::size_t>(slots[static_cast<std::size_t>(chosen)])] = -1;
    }
    if (chosen < 0) {
      slots.push_back(-1);
      chosen = static_cast<int>(slots.size()) - 1;
    }
    slots[static_cast<std::size_t>(chosen)] = static_cast<int>(b);
    slot_of[b] = chosen;
  };
  auto ready = [&](std::size_t i) {
    --pending[bucket(i)];
    while (next < nb && pending[static_cast<std::size_t>(next)] == 0) launched[static_cast<std::size_t>(next++)] = true;
  };
  // A layer with two parameters (weight, bias / gamma, beta) at entries i, i + 1 places both,
  // then reports them in reverse order (Linear and LayerNorm backward).
  auto layer = [&](std::size_t i) {
    place(i);
    place(i + 1);
    ready(i + 1);
    ready(i);
  };
  const std::size_t n = plan.entries.size();
  place(0);      // the tied head adds its share of wte first
  layer(n - 2);  // ln_f
  for (std::int64_t l = c.layers; l-- > 0;) {
    const std::size_t first = 2 + static_cast<std::size_t>(l) * 12;
    for (const std::size_t block : {first + 6, first}) {  // the MLP, then attention
      layer(block + 4);                                   // the output projection
      layer(block + 2);                                   // the first Linear
      layer(block);                                       // the LayerNorm
    }
  }
  place(0);  // the embedding: wte (placed already), then wpe; reported wpe, wte
  place(1);
  ready(1);
  ready(0);
  return static_cast<int>(slots.size());
}

}  // namespace

MemoryPlan memory_plan(const GptConfig& c, const PlanOptions& o) {
  const std::int64_t T = o.seq_len == 0 ? c.context : o.seq_len;
  TUTTI_CHECK_ARG(
      o.world_size >= 1 && o.zero_stage >= 0 && o.zero_stage <= 3 && o.micro_batch >= 1 && T >= 1 && T <= c.context,
      "memory_plan: world_size ", o.world_size, " (>= 1), zero_stage ", o.zero_stage, " (0-3), micro_batch ",
      o.micro_batch, " (>= 1) and seq_len ", T, " (1 to the context ", c.context, ") are out of range");
  TUTTI_CHECK_ARG(
      o.recompute.mode != Recompute::Mode::every || (o.recompute.every >= 1 && o.recompute.every <= c.layers),
      "memory_plan: ", o.recompute.str(), " but ", c.fingerprint(), " has ", c.layers, " layers");
  TUTTI_CHECK_ARG(is_floating(o.compute) && (o.grad == DType::f32 || o.grad == o.compute) && is_floating(o.grad_comm),
                  "memory_plan: compute ", name_of(o.compute), ", gradients ", name_of(o.grad), ", comm ",
                  name_of(o.grad_comm), ": gradients are f32 or the compute dtype");
  const std::int64_t B = o.micro_batch, C = c.width, H = c.heads, V = c.padded_vocab, L = c.layers;
  const std::int64_t N = B * T;  // tokens of the micro-batch
  const std::int64_t cd = bytes_of(o.compute), gd = bytes_of(o.grad), wd = bytes_of(o.grad_comm);
  const bool half = o.compute != DType::f32;

  nn::FlatPlanOptions po;
  po.bucket_cap_mb = o.bucket_cap_mb;
  po.first_bucket_cap_mb = o.first_bucket_cap_mb;
  po.grad_element_bytes = static_cast<std::size_t>(gd);
  po.world_size = o.zero_stage > 0 ? o.world_size : 1;
  const std::vector<nn::PlanParam> params = gpt_params(c);
  const bool zero3 = o.zero_stage == 3;
  std::vector<std::string> groups;  // ZeRO-3: Gpt::gather_group, a bucket per run of one group
  if (zero3) {
    for (const nn::PlanParam& p : params) {
      groups.push_back(Gpt::gather_group(p.name));
      const bool same = po.segments.size() > 0 && groups.back() == groups[groups.size() - 2];
      po.segments.push_back(po.segments.empty() ? 0 : po.segments.back() + (same ? 0 : 1));
    }
    po.bucket_cap_mb = po.first_bucket_cap_mb = 1e12;
  }
  const nn::FlatPlan plan = nn::make_flat_plan(params, po);
  const std::int64_t total = plan.total, shard = o.zero_stage > 0 ? plan.shard_numel : plan.total;
  std::int64_t largest = 0, largest_group = 0, resident = 0;
  for (const nn::PlanBucket& b : plan.buckets) {
    largest = std::max(largest, b.numel());
    if (!zero3) continue;
    if (groups[b.entries.front()].empty())
      resident += b.numel();
    else
      largest_group = std::max(largest_group, b.numel());
  }

  MemoryPlan m;
  m.parameters = c.parameter_count();
  m.flat_total = total;
  m.shard = shard;
  m.buckets = static_cast<int>(plan.buckets.size());
  auto row = [&](std::string name, std::int64_t bytes, std::string detail) {
    m.rows.push_back({std::move(name), bytes, std::move(detail)});
  };
  const std::string sh = o.zero_stage > 0 ? " (shard " + grouped(shard) + " of " + grouped(total) + ")" : "";

  // Values (FlatStorage::flatten) and, in half precision, the compute copies the model reads.
  if (zero3) {
    // ZeRO-3 (ddp/zero3.h): the shards the gathers read; the whole parameters below.
    row("parameters", shard * (half ? cd : 4),
        std::string(half ? name_of(o.compute) : "f32") + " shard, " + grouped(shard) + " of " + grouped(total) +
            " elements" + (half ? "" : " (the masters)"));
    row("master weights", half ? shard * 4 : 0, half ? "f32" + sh : "none: the f32 shard is the masters");
  } else if (half) {
    row("parameters", total * cd, std::string(name_of(o.compute)) + " compute copies, " + grouped(total) + " elements");
    row("master weights", (o.zero_stage > 0 ? shard : total) * 4, "f32" + sh);
  } else {
    row("parameters", total * 4,
        "f32 values, " + grouped(total) + " elements (" + grouped(m.parameters) + " + padding)");
    row("master weights", 0, "none: the f32 values are the masters");
  }
  // ZeRO-3's two gather buffers (the largest layer) and the resident group (embeddings, ln_f).
  row("gathered parameters", zero3 ? (2 * largest_group + resident) * cd : 0,
      zero3 ? "2 gather buffers of " + grouped(largest_group) + " elements (a layer) + the resident group of " +
                  grouped(resident) + " (embeddings, ln_f), " + std::string(name_of(o.compute))
            : "none: the parameters are whole");
  // The reducer's buffer (stages 0, 1) or ZeRO-2's and 3's shard.
  row("gradients", (o.zero_stage >= 2 ? shard : total) * gd,
      std::string(name_of(o.grad)) + (o.zero_stage >= 2 ? sh : ", the reducer's flat buffer"));
  const int states = o.optimizer == PlanOptions::Optimizer::adamw          ? 2
                     : o.optimizer == PlanOptions::Optimizer::sgd_momentum ? 1
                                                                           : 0;
  row("optimizer state", states * shard * 4, std::to_string(states) + " x f32" + sh);
  // Communication: the per-bucket staging in the wire dtype (stages 0, 1), or ZeRO-2's pool of
  // bucket buffers (gradients, plus staging) of the largest bucket's size.
  std::int64_t comm = 0;
  std::string comm_detail;
  if (o.zero_stage < 2) {
    if (wd != gd) comm = total * wd;
    comm_detail = std::to_string(m.buckets) + " bucket(s)" +
                  (wd != gd ? ", staged in " + std::string(name_of(o.grad_comm)) : ", none staged (same dtype)");
  } else {
    const int slots = zero2_slots(c, plan);
    comm = slots * largest * (gd + (wd != gd ? wd : 0));
    comm_detail = std::to_string(slots) + " bucket buffer(s) of " + grouped(largest) + " elements (of " +
                  std::to_string(m.buckets) + " buckets)" + (wd != gd ? " + staging" : "");
  }
  if (o.deterministic) {
    comm += (total + 2) * 8 + 4;
    comm_detail += ", exact-sum accumulator";
  }
  row("communication buffers", comm, comm_detail);
  row("batch", o.batch_on_device ? 2 * N * 4 : 0,
      "tokens and targets, " + std::to_string(B) + " x " + std::to_string(T) + " i32 each");

  // Activations: every layer's reusable buffers (Module::buffer), forward's and backward's.
  // LayerNorm: y, dx [N, C], mean and rstd [N] f32. Linear: y [N, out], dx [N, in].
  // Attention: y [N, C], probs [B, H, T, T], dqkv [N, 3C]. GELU: y, dx [N, 4C].
  // Residual: y, dx [N, C] (its own, also when checkpointed).
  const std::int64_t ln = 2 * N * C * cd + 2 * N * 4;
  const std::int64_t residual = 2 * N * C * cd;
  const std::int64_t attn_body =
      ln + (3 * N * C + N * C) * cd + (N * C + B * H * T * T + 3 * N * C) * cd + (N * C + N * C) * cd;
  const std::int64_t mlp_body = ln + (4 * N * C + N * C) * cd + (4 * N * C + 4 * N * C) * cd + (N * C + 4 * N * C) * cd;
  bool attn_ckpt = false, mlp_ckpt = false;
  std::int64_t attn_blocks = 0;   // checkpointed attention blocks
  std::int64_t act = N * C * cd;  // the embedding's output
  for (std::int64_t l = 0; l < L; ++l) {
    const bool a = o.recompute.checkpoints(l, false), p = o.recompute.checkpoints(l, true);
    attn_ckpt = attn_ckpt || a;
    attn_blocks += a ? 1 : 0;
    mlp_ckpt = mlp_ckpt || p;
    act += residual * 2 + (a ? 0 : attn_body) + (p ? 0 : mlp_body);
  }
  act += ln;  // ln_f
  m.layer_bytes_kept = 2 * residual + attn_body + mlp_body;
  m.layer_bytes_checkpointed = 2 * residual;
  row("activations", act,
      std::to_string(L) + " layers: " + human(m.layer_bytes_kept) + " each kept" +
          (attn_ckpt || mlp_ckpt
               ? ", " + human(m.layer_bytes_checkpointed) + " each checkpointed (" + o.recompute.str() + ")"
               : ""));
  // The shared workspace of the checkpointed bodies (Gpt::set_recompute): per position in the
  // body (LayerNorm, Linear, attention or GELU, Linear) and slot, the largest buffer of the
  // kinds checkpointed.
  std::int64_t ws = 0;
  if (attn_ckpt || mlp_ckpt) {
    auto big = [&](std::int64_t attn, std::int64_t mlp) { return std::max(attn_ckpt ? attn : 0, mlp_ckpt ? mlp : 0); };
    ws = ln;
    ws += (big(3 * N * C, 4 * N * C) + N * C) * cd;                                          // Linear(C, 3C | 4C)
    ws += (big(N * C, 4 * N * C) + big(B * H * T * T, 4 * N * C) + big(3 * N * C, 0)) * cd;  // attention | GELU
    ws += (N * C + big(N * C, 4 * N * C)) * cd;                                              // Linear(C | 4C, C)
  }
  std::string ws_detail = ws ? "one body's buffers, shared by the checkpointed blocks" : "no recomputation";
  if (attn_ckpt && mlp_ckpt) {
    // The first step grows the workspace's slots as the MLP body needs more than the attention
    // body (Module::buffer reallocates); the old buffers stay alive while layer 0's attention
    // modules still view them (its qkv and output, and its probabilities when GELU's gradient
    // outgrows them at short T), that is until layer 0's attention block recomputes, last in
    // backward, before its residual's input gradient is allocated.
    // Allocated only after that: the residual's input gradient and, when no other attention
    // block checkpoints, the workspace's dqkv.
    const std::int64_t superseded = (3 * N * C + N * C + (4 * C > H * T ? B * H * T * T : 0)) * cd;
    const std::int64_t after = (N * C + (attn_blocks == 1 ? 3 * N * C : 0)) * cd;
    m.first_step_extra = std::max<std::int64_t>(0, superseded - after);
    ws += m.first_step_extra;
    ws_detail += ", + the first step's superseded buffers (" + human(superseded) + ") until layer 0 recomputes";
  }
  row("recompute workspace", ws, ws_detail);
  std::ostringstream logits;
  logits << "[" << B << ", " << T << ", " << V << "] " << name_of(o.compute)
         << " and the loss's gradient of them, + the head's input gradient";
  row("logits", 2 * N * V * cd + N * C * cd, logits.str());
  row("workspace", 16, "scalars: the loss, the reducer's flag, the gradient norm");
  if (o.gpu) {
    // kernels/cuda: attention backward's scratch (q, k, v, dy, dq, dk, dv head-major and dP),
    // the largest stream-ordered scratch of a step, alive only during that kernel; cuBLASLt's
    // workspace for the model's stream.
    row("GPU kernel scratch", (7 * N * C + B * H * T * T) * cd + (32 << 20),
        "attention backward's scratch + cuBLASLt's workspace (not in Storage's count)");
  }
  if (o.evaluation) {
    m.rows.push_back({"evaluation", N * V * cd + N * 4 + 16,
                      "between steps: the evaluating loss's logits gradient, the targets, scalars", true});
  }
  if (o.state_dict) {
    const bool gathers = o.zero_stage > 0 && (half || zero3);
    m.rows.push_back({"state dict", gathers ? total * 4 : 0,
                      gathers ? "between steps: model_state_dict gathers the f32 values whole"
                              : "between steps: nothing (the values are whole on every rank)",
                      true});
  }
  return m;
}

std::int64_t MemoryPlan::step_total() const {
  std::int64_t n = 0;
  for (const MemoryRow& r : rows) n += r.between_steps ? 0 : r.bytes;
  return n;
}

std::int64_t MemoryPlan::total() const {
  std::int64_t between = 0;
  for (const MemoryRow& r : rows) between = std::max(between, r.between_steps ? r.bytes : 0);
  return std::max(step_total(), step_total() - first_step_extra + between);
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
  std::snprintf(line, sizeof line, "  %-22s %12s  (%s bytes)%s\n", "total", human(total()).c_str(),
                grouped(total()).c_str(),
                total() == step_total() ? "" : ": after the first step, with the largest between-step row");
  s << line;
  return s.str();
}

std::int64_t largest_micro_batch(const GptConfig& config, PlanOptions options, std::int64_t device_bytes,
                                 std::int64_t limit) {
  // The total grows with the micro-batch: bisect.
  auto fits = [&](std::int64_t b) {
    options.micro_batch = b;
    return memory_plan(config, options).total() <= device_bytes;
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

std::string fit_advice(const GptConfig& config, const PlanOptions& options, std::int64_t device_bytes) {
  const std::int64_t now = memory_plan(config, options).total();
  if (now <= device_bytes) return "";
  std::ostringstream s;
  s << "does not fit: " << human(now) << " per rank, " << human(device_bytes)
    << " available. To fit, change one or more of:\n";
  auto option = [&](const std::string& what, const PlanOptions& o) {
    const std::int64_t t = memory_plan(config, o).total();
    s << "  - " << what << ": " << human(t) << (t <= device_bytes ? " (fits)" : " (still too large)") << "\n";
  };
  const std::int64_t b = largest_micro_batch(config, options, device_bytes, options.micro_batch);
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

}  // namespace tutti::models
