// What the benchmarks report of repeated timings: medians (a run preempted by another process
// on a shared machine moves a mean, not a median). Header-only, for benchmarks/*.
#pragma once

#include <algorithm>
#include <vector>

namespace bench {

// The median of v (the mean of the two middle values for an even count); 0 when empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace bench
