#include "sync.h"

#include <cstdio>
#include <string>

namespace example {

namespace {

// "ddp" -> 0; "diloco:H" -> H (>= 1); InvalidArgument naming --sync otherwise.
int parse_sync(const std::string& text) {
  if (text == "ddp") return 0;
  const std::string prefix = "diloco:";
  TUTTI_CHECK_ARG(text.rfind(prefix, 0) == 0 && text.size() > prefix.size(), "--sync: '", text,
                  "' is not ddp or diloco:H (H: inner steps between outer syncs, e.g. diloco:50)");
  const std::string h = text.substr(prefix.size());
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(h, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TUTTI_CHECK_ARG(used == h.size() && used > 0, "--sync: '", text, "': H must be a whole number, not '", h, "'");
  TUTTI_CHECK_ARG(value >= 1 && value <= 1000000000, "--sync: '", text,
                  "': H (inner steps between outer syncs) must be at least 1");
  return static_cast<int>(value);
}

}  // namespace

Sync::Sync(tutti::Job& job, const RunFlags& f) : job_(job), f_(f), sync_every_(parse_sync(f.sync)) {
  job.check_same("--sync", f.sync);
  job.check_same("--ranks-per-node", std::to_string(f.ranks_per_node));
  mode_ = diloco() ? "diloco:" + std::to_string(sync_every_) : "ddp";
  if (!diloco()) {
    TUTTI_CHECK_ARG(f.streaming == 1, "--streaming applies to --sync diloco:H");
    TUTTI_CHECK_ARG(f.overlap == 0, "--overlap applies to --sync diloco:H");
    example::ddp_communicator(job, f, hierarchical_);
    return;
  }
  job.check_same(
      "--outer-lr, --outer-momentum, --outer-dtype, --error-feedback, --streaming, --overlap, "
      "--outer-exchange",
      std::to_string(f.outer_lr) + " " + std::to_string(f.outer_momentum) + " " + f.outer_dtype + " " +
          std::to_string(f.error_feedback) + " " + std::to_string(f.streaming) + " " + std::to_string(f.overlap) + " " +
          f.outer_exchange);
  TUTTI_CHECK_ARG(f.allreduce == "flat", "--allreduce ", f.allreduce,
                  " applies to --sync ddp; --sync diloco already reduces inside the node and "
                  "syncs across nodes");
  TUTTI_CHECK_ARG(!f.deterministic,
                  "--deterministic applies to --sync ddp (a model independent of the number of ranks); --sync diloco "
                  "depends on the node layout by design");
  // The outer optimizer's values and the node layout (two nodes at least, of equal sizes) are
  // checked by DiLoCo's constructor in start(), whose errors name the flags.
  groups_ = job.node_groups({}, f.ranks_per_node);
}

tutti::Communicator& Sync::ddp_communicator() {
  if (diloco()) return *groups_.intra;
  return hierarchical_ ? *hierarchical_ : job_.communicator();
}

void Sync::start(tutti::ddp::DistributedDataParallel& ddp, tutti::optim::Optimizer& optimizer) {
  if (!diloco()) return;
  tutti::ddp::DiLoCoOptions o;
  o.sync_every = sync_every_;
  o.outer_lr = f_.outer_lr;
  o.outer_momentum = f_.outer_momentum;
  o.outer_dtype = tutti::ddp::parse_outer_dtype(f_.outer_dtype);
  o.error_feedback = f_.error_feedback;
  o.fragments = f_.streaming;
  o.overlap_steps = f_.overlap;
  o.exchange = tutti::ddp::parse_outer_exchange(f_.outer_exchange);
  diloco_ = std::make_unique<tutti::ddp::DiLoCo>(ddp, optimizer, groups_, o);
}

void Sync::add_state(tutti::train::State& state) {
  if (diloco_) {
    state.add_collective("diloco.", *diloco_);
    return;
  }
  state.add(
      "diloco.", [] { return tutti::StateDict(); },
      [](const tutti::StateDict& saved) {
        TUTTI_CHECK_ARG(saved.empty(),
                        "the checkpoint was written with --sync diloco (it holds DiLoCo's outer state): resume it "
                        "with --sync diloco:H, or start afresh");
      });
}

bool Sync::end_step(const tutti::train::Run& run) {
  return diloco_ && diloco_->end_inner_step(/*last_step=*/run.step() + 1 == run.steps());
}

std::string Sync::describe() const {
  if (!diloco()) return mode_;
  char text[256];
  std::string streaming = f_.streaming > 1 ? ", streaming " + std::to_string(f_.streaming) + " fragments" : "";
  if (f_.overlap > 0) streaming += ", overlap " + std::to_string(f_.overlap) + " steps";
  if (f_.outer_exchange != "auto") streaming += ", " + f_.outer_exchange;
  std::snprintf(text, sizeof text, "%s (outer %s lr %g momentum %g, %s%s%s; %d nodes x %d)", mode_.c_str(), "Nesterov",
                f_.outer_lr, f_.outer_momentum, f_.outer_dtype.c_str(), f_.error_feedback ? ", error feedback" : "",
                streaming.c_str(), groups_.node_count(), groups_.node_sizes.front());
  return text;
}

}  // namespace example
