// PowerSGD: low-rank gradient compression with error feedback for plain data parallelism
// (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
// Distributed Optimization", NeurIPS 2019; the algorithm of PyTorch's powerSGD_hook).
//
// Register a PowerSgdHook, a communication hook (ddp/comm_hook.h), on the model's
// DistributedDataParallel (the trainers' `--allreduce powersgd:R`):
//   auto powersgd = std::make_shared<ddp::PowerSgdHook>(ddp::PowerSgdOptions{.rank = 4});
//   ddp.register_comm_hook(powersgd);   // before train::State is built: it saves the state
// and the Reducer sends, for each bucket, instead of the bucket:
//   - for every gradient of 2+ dims, viewed as a matrix M [n, m] (the trailing dims folded)
//     whose rank-r factors are small enough (n·m > min_compression_ratio · r·(n+m), with
//     r = min(rank, n, m)), two thin matrices P [n, r] and Q [m, r]:
//       M = grad + error                (error feedback; error starts at zero)
//       P = M · Q                       (Q: last step's, or random at the first step)
//       allreduce(P) (sum)              (every matrix's P of the bucket in one flat buffer)
//       P = orthonormal columns of P    (Gram-Schmidt, on the host, in double)
//       Q = M^T · P; allreduce(Q) (sum) (one flat buffer)
//       grad = P · Q^T / N              (the averaged gradient's approximation, = P·P^T·mean(M))
//       error = M − P · Q^T / N         (this rank's M: what the approximation left out)
//   - every other gradient (biases, LayerNorm, small matrices) uncompressed, all of the
//     bucket's in one flat buffer, allreduced as DDP does.
// The first `start_step` synchronized steps allreduce every bucket whole (PyTorch's
// start_powerSGD_iter: the warm-up, where gradients change fastest).
//
// Where it works, and what it refuses (InvalidArgument naming PowerSgdOptions' field at the
// hook's construction, naming PowerSgdHook at its registration):
//   - plain data parallelism: sharding none (DistributedDataParallel with Replicate), not in
//     deterministic mode;
//   - f32 gradients on the wire (grad_dtype f32 and grad_comm_dtype f32 or unset);
//   - averaging (ReducerOptions::average true);
//   - the CPU and the GPU (the GEMMs are kernels::matmul's; the orthonormalization runs on the
//     host, so a GPU copies each bucket's P to the host and back: one host sync per bucket);
//   - over the Reducer's communicator, the whole world (not across nodes only: with node
//     groups, give DDP the world's communicator, not hierarchical_communicator's).
// The error is kept in the units of the Reducer's buffer before finish()'s divisor (accumulation
// steps · loss scale): use it without a dynamic loss scaler (fp32 or bf16 compute), since a
// step that overflows puts inf into the error and a changed scale mis-scales it.
// Costs and cadence: finish() runs the second half (orthonormalize, Q, the second allreduce,
// the product) for every bucket, so only the allreduce of P overlaps backward.
// docs/thin-links.md ("PowerSGD") has the measurements.
//
// Checkpoints. The state lives in the hook; PowerSgdHook::state_dict (COLLECTIVE) returns it
// and train::Run keeps it under "powersgd." (train::State registers it): the step count
// ("step": finish() calls, the warm-up's count), the world size ("ranks"), the options
// ("options.<field>"), each compressed matrix's Q by parameter name ("q.<name>", [m, r];
// "q_drawn": a warm start has one) and every rank's error by rank and parameter name
// ("rank<k>.error.<name>", the parameter's shape), all-gathered to rank 0 bucket by bucket. Q
// and the step count are the same bits on every rank; the error is each rank's own.
// PowerSgdHook::load_state_dict (not collective; every rank reads rank 0's state):
//   - the same options and world size: PowerSGD continues exactly (bit for bit on the CPU); the
//     entries are found by name, so another bucket layout loads them too;
//   - another world size: as DiLoCo on another number of nodes, the replicated state (the step
//     count, Q) is kept and the error starts at zero (it is what each old rank's own gradients
//     were still owed);
//   - other options (any field of PowerSgdOptions), or no PowerSGD state (a checkpoint of a run
//     without it or of an older tutti, a memory snapshot): PowerSGD starts afresh, as a new
//     hook (start_step plain steps, zero error, a new random Q);
//   - a run without PowerSGD: nothing reads "powersgd.", and train::Run's note says that the
//     checkpoint's state is not used.
// Each case but the first returns a note, which train::Run adds to its note() (the trainers'
// start-up line). Truncated or mismatched entries throw InvalidArgument naming the entry, before
// anything changes. The error is in the buffer's units (above): resume with the same
// accumulation steps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tutti/ddp/comm_hook.h"

namespace tutti::ddp {

struct PowerSgdOptions {
  // r: the rank of the approximation of each matrix (clamped to min(n, m)). Bytes per matrix on
  // the wire: 4·r·(n + m) instead of 4·n·m. Must be >= 1.
  int rank = 4;
  // Synchronized steps (finish() calls) that allreduce every gradient uncompressed before
  // PowerSGD starts. 0: compress from the first step. Must be >= 0.
  int start_step = 10;
  // A matrix [n, m] is compressed only when n·m > min_compression_ratio · r·(n + m). 1: whenever
  // the factors are smaller than the matrix; 0: every matrix of 2+ dims (tests use it to
  // compress at full rank). Must be >= 0.
  double min_compression_ratio = 1.0;
  // true: what the approximation of this rank's M left out is added to the next step's
  // gradient (without it PowerSGD does not converge like SGD).
  bool error_feedback = true;
  // true: each step's power iteration starts from the last step's Q (one iteration a step is
  // then enough); false: from a fresh random Q every step.
  bool warm_start = true;
  // The random Q's seed; every rank draws the same Q (a counter-based generator of the seed,
  // the step and the matrix).
  std::uint64_t seed = 0x9e3779b97f4a7c15ULL;
};

class PowerSgd;  // the algorithm's buffers and steps (src/ddp/powersgd.h)

// PowerSGD as a communication hook. Not collective to construct; bound by registration to one
// reducer (a second registration throws).
class PowerSgdHook final : public CommHook {
 public:
  // Checks the options (InvalidArgument naming the field: rank >= 1, start_step >= 0,
  // min_compression_ratio >= 0).
  explicit PowerSgdHook(PowerSgdOptions options = {});
  ~PowerSgdHook() override;
  PowerSgdHook(const PowerSgdHook&) = delete;
  PowerSgdHook& operator=(const PowerSgdHook&) = delete;

  const PowerSgdOptions& options() const { return options_; }
  // How many gradients it compresses and how many elements they hold (0 before registration).
  std::int64_t compressed_count() const;
  std::int64_t compressed_numel() const;

  std::string name() const override { return "powersgd"; }
  // Refuses (InvalidArgument naming PowerSgdHook) sharding other than none, gradients or a wire
  // dtype other than f32, averaging off, and a second binding.
  void bind(const CommHookContext& context) override;
  bool active() const override;
  std::int64_t launch(int bucket, const Stream& stream) override;
  std::int64_t finish(const Stream& stream, double* run_ms) override;
  void end_step() override;
  std::int64_t bytes() const override;
  // "Checkpoints" above: COLLECTIVE (every rank's error is all-gathered to rank 0); empty
  // before registration. load_state_dict returns "" when PowerSGD continues exactly, else
  // what it did instead.
  StateDict state_dict(const Stream& stream) override;
  std::string load_state_dict(const StateDict& state, const Stream& stream) override;
  bool collective_state() const override { return true; }
  std::string not_in_snapshots() const override {
    return "memory snapshots keep no PowerSGD state: PowerSGD starts afresh";
  }

 private:
  PowerSgd& bound(const char* what) const;

  PowerSgdOptions options_;
  std::shared_ptr<const nn::FlatPlan> plan_;
  std::unique_ptr<PowerSgd> impl_;
};

}  // namespace tutti::ddp
