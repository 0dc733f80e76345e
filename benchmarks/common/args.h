// Flag values the benchmarks take as comma-separated lists ("--modes local,overlap,hier").
// Header-only, for benchmarks/*.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace bench {

// The non-empty items of a comma-separated list, in order.
inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace bench
