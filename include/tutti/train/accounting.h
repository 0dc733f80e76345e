// Accounting: what a training run has cost so far, in time and money, over every attempt of
// it (an attempt: one start of the program; a relaunch after a failure is the next attempt of
// the same run when it resumes). train::Run computes it (Run::accounting()), writes it to the
// JSON summary and the status file, and the trainers export it as Prometheus metrics
// (obs::TrainingMetrics::observe_accounting). docs/launcher.md has the definitions with an
// example.
//
// The attempts before this one are known from the status file (RunOptions::status_file, which
// tutti-launch keeps across its relaunches): without it an attempt sees only itself, and
// counts the steps it resumed as if they had cost exactly their own time.
#pragma once

namespace tutti::train {

struct Accounting {
  int attempts = 1;         // this attempt and the earlier ones of the same run
  double wall_seconds = 0;  // since the run's first attempt started (down time between attempts included)
  double rank_hours = 0;    // ranks x hours of the attempts: GPU-hours on GPUs, process-hours on the CPU
  double useful_seconds =
      0;               // the time of the steps the run's state holds: saved with it, so a redone step counts once
  double goodput = 0;  // useful_seconds / wall_seconds (0..1)
  // Of wall_seconds, the time before this attempt that left nothing in the state: the steps
  // done after the last checkpoint or snapshot that survived, the failure, the restart.
  double lost_seconds = 0;
  double cost = 0;              // RunOptions::price_per_hour x rank_hours (0: no price given)
  double cost_per_million = 0;  // cost per million RunOptions::work_unit of the steps done (0: unknown)
};

}  // namespace tutti::train
