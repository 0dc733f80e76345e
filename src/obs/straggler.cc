#include "tutti/obs/straggler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "tutti/core/error.h"

namespace tutti::obs {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

const char* const kWhat[2] = {"compute before the first collective", "data loading"};

}  // namespace

WindowFigures window_figures(std::vector<double> values) {
  WindowFigures f;
  f.median = median(values);
  for (double& v : values) v = std::abs(v - f.median);
  f.noise = 1.4826 * median(std::move(values));  // the MAD, scaled to a normal distribution's sigma
  return f;
}

std::string StragglerReport::message() const {
  if (rank < 0) return "no straggler";
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "straggler: rank %d%s is %.0f%% slower than the median of the other ranks in %s (%.1f ms vs %.1f ms "
                "per step, noise %.1f ms, %d windows, steps %lld-%lld)",
                rank, host.empty() ? "" : (" (" + host + ")").c_str(), 100.0 * slower_by, what.c_str(), 1e3 * seconds,
                1e3 * median_seconds, 1e3 * noise_seconds, windows, static_cast<long long>(first_step),
                static_cast<long long>(last_step));
  return buf;
}

StragglerDetector::StragglerDetector(int rank, int world_size, std::vector<std::string> hosts, StragglerOptions options)
    : rank_(rank), world_(world_size), hosts_(std::move(hosts)), options_(options) {
  TUTTI_CHECK_ARG(world_size >= 1 && rank >= 0 && rank < world_size, "StragglerDetector: rank ", rank, " of ",
                  world_size);
  TUTTI_CHECK_ARG(options_.every >= 1, "StragglerDetector: every must be >= 1, got ", options_.every);
  TUTTI_CHECK_ARG(options_.threshold >= 0 && options_.noise_factor >= 0,
                  "StragglerDetector: threshold and noise_factor must be >= 0");
  TUTTI_CHECK_ARG(options_.confirm_windows >= 1, "StragglerDetector: confirm_windows must be >= 1, got ",
                  options_.confirm_windows);
  TUTTI_CHECK_ARG(hosts_.empty() || static_cast<int>(hosts_.size()) == world_size,
                  "StragglerDetector: hosts must name every rank");
}

void StragglerDetector::add_step(std::int64_t step, double compute_before_comm_s, double data_s) {
  compute_.push_back(compute_before_comm_s);
  data_.push_back(data_s);
  if (first_step_ < 0) first_step_ = step;
  last_step_ = step;
}

bool StragglerDetector::due(std::int64_t step) const { return step > 0 && step % options_.every == 0; }

void StragglerDetector::fill(float* slots) const {
  std::fill(slots, slots + slot_count(), 0.0f);
  const WindowFigures compute = window_figures(compute_), data = window_figures(data_);
  float* mine = slots + 4 * rank_;
  mine[0] = static_cast<float>(compute.median);
  mine[1] = static_cast<float>(compute.noise);
  mine[2] = static_cast<float>(data.median);
  mine[3] = static_cast<float>(data.noise);
}

StragglerReport StragglerDetector::analyze(const float* reduced, double scale) {
  StragglerReport r;
  r.checked = true;
  r.first_step = first_step_;
  r.last_step = last_step_;
  for (int i = 0; i < world_; ++i) {
    const float* s = reduced + 4 * i;
    r.per_rank.push_back({{s[0] * scale, s[1] * scale}, {s[2] * scale, s[3] * scale}});
  }
  const std::int64_t window_first = first_step_;
  compute_.clear();
  data_.clear();
  first_step_ = last_step_ = -1;
  if (world_ < 2) return r;
  // For each cause, the slowest rank against the median of the others, and whether its excess
  // stands out of the noise; a cause names a rank once it did so in confirm_windows windows in a
  // row. Of the causes that name one, the larger excess wins.
  double best_excess = 0, best_candidate_excess = 0;
  for (int what = 0; what < 2; ++what) {
    auto get = [&](int i) -> const WindowFigures& {
      const auto& p = r.per_rank[static_cast<std::size_t>(i)];
      return what == 0 ? p.first : p.second;
    };
    int slowest = 0;
    for (int i = 1; i < world_; ++i) {
      if (get(i).median > get(slowest).median) slowest = i;
    }
    std::vector<double> others, noises;
    for (int i = 0; i < world_; ++i) {
      noises.push_back(get(i).noise);
      if (i != slowest) others.push_back(get(i).median);
    }
    const double m = median(others), v = get(slowest).median, excess = v - m;
    // Its lead over the next slowest rank must stand out of the ranks' step-to-step noise: two
    // ranks slowed alike, or ranks that scatter as much as their steps do, name nobody. The noise
    // is the ranks' typical one, or the slowest rank's own where that is larger: a rank that
    // another process preempts on its core now and then is slower by a part of its steps, and its
    // steps scatter by as much as its median moved (measured: up to 40% slower, noise 28% of a
    // step); a rank slower on every step (a slower device, a busy loop) scatters as the others do.
    const double lead = v - *std::max_element(others.begin(), others.end());
    const double noise = std::max(median(noises), get(slowest).noise);
    const bool stands_out =
        v > m * (1.0 + options_.threshold) && excess > options_.min_seconds && lead > options_.noise_factor * noise;
    Streak& streak = streak_[what];
    if (!stands_out) {
      streak = Streak{};
      continue;
    }
    if (streak.rank == slowest) {
      ++streak.windows;
    } else {
      streak = Streak{slowest, 1, window_first};
    }
    if (excess > best_candidate_excess) {
      best_candidate_excess = excess;
      r.candidate = slowest;
    }
    if (streak.windows >= options_.confirm_windows && excess > best_excess) {
      best_excess = excess;
      r.rank = slowest;
      r.what = kWhat[what];
      r.seconds = v;
      r.median_seconds = m;
      r.slower_by = m > 0 ? v / m - 1.0 : 0.0;
      r.noise_seconds = noise;
      r.windows = streak.windows;
      r.first_step = streak.first_step;
    }
  }
  if (r.rank >= 0) {
    if (!hosts_.empty()) r.host = hosts_[static_cast<std::size_t>(r.rank)];
    r.new_straggler = r.rank != reported_rank_ || r.what != reported_what_;
    reported_rank_ = r.rank;
    reported_what_ = r.what;
  } else {
    reported_rank_ = -1;
    reported_what_.clear();
  }
  return r;
}

StragglerReport StragglerDetector::exchange(Communicator& comm) {
  TUTTI_CHECK_ARG(comm.size() == world_ && comm.rank() == rank_, "StragglerDetector::exchange: the communicator's ",
                  "rank/size ", comm.rank(), "/", comm.size(), " are not the detector's ", rank_, "/", world_);
  std::vector<float> slots(static_cast<std::size_t>(slot_count()));
  fill(slots.data());
  Tensor t = Tensor::from_floats(slots, {slot_count()});
  CallOptions call;
  call.label = "straggler check";
  comm.allreduce(t, ReduceOp::sum, call).wait();
  return analyze(t.data_as<float>());
}

std::vector<std::string> all_hosts(Communicator& comm, const std::string& host) {
  constexpr std::int64_t kMax = 256;  // bytes of a host name (HOST_NAME_MAX is 64 on Linux)
  const int n = comm.size();
  std::vector<std::int64_t> mine(kMax, 0);
  for (std::size_t i = 0; i < host.size() && i < kMax; ++i) mine[i] = static_cast<unsigned char>(host[i]);
  Tensor in = Tensor::from_ints(mine, {kMax}, DType::i32);
  Tensor all = Tensor::empty({n * kMax}, DType::i32);
  CallOptions call;
  call.label = "host names";
  comm.allgather(in, all, call).wait();
  const std::vector<std::int64_t> chars = all.to_ints();
  std::vector<std::string> hosts(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (std::int64_t i = 0; i < kMax; ++i) {
      const std::int64_t c = chars[static_cast<std::size_t>(r * kMax + i)];
      if (c == 0) break;
      hosts[static_cast<std::size_t>(r)].push_back(static_cast<char>(c));
    }
  }
  return hosts;
}

}  // namespace tutti::obs
