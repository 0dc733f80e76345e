#include "nn/slices.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "tutti/core/error.h"

namespace tutti::nn {

namespace {

// Where a slice's elements are along its dimension: (whole's begin, count) of each block, in
// order, laid end to end in the part; `outer`, `inner` the products of the dimensions before and
// after it.
struct Geometry {
  std::int64_t outer = 1, inner = 1, along = 0, part_along = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;
};

Geometry slice_geometry(const Tensor& whole, const Parameter::InitSlice& s, const Tensor& part) {
  const int dim = s.dim;
  TUTTI_CHECK_ARG(
      dim >= 0 && dim < whole.ndim() && part.ndim() == whole.ndim() && s.parts >= 1 && s.part >= 0 && s.part < s.parts,
      "a slice ", part.str(), " (part ", s.part, " of ", s.parts, " along dimension ", dim, ") does not fit ",
      whole.str());
  Geometry g;
  g.along = whole.dim(dim);
  const std::vector<std::int64_t> blocks = s.blocks.empty() ? std::vector<std::int64_t>{g.along} : s.blocks;
  std::int64_t at = 0;
  for (const std::int64_t b : blocks) {
    TUTTI_CHECK_ARG(b > 0 && b % s.parts == 0, "a slice of ", whole.str(), ": block ", b, " along dimension ", dim,
                    " does not divide into ", s.parts, " parts");
    g.runs.emplace_back(at + b / s.parts * s.part, b / s.parts);
    g.part_along += b / s.parts;
    at += b;
  }
  TUTTI_CHECK_ARG(at == g.along && part.dim(dim) == g.part_along, "a slice ", part.str(), " (part ", s.part, " of ",
                  s.parts, " of blocks summing to ", at, " along dimension ", dim, ") does not fit ", whole.str());
  for (int d = 0; d < whole.ndim(); ++d) {
    if (d != dim) {
      TUTTI_CHECK_ARG(part.dim(d) == whole.dim(d), "a slice ", part.str(), " differs from ", whole.str(),
                      " in dimension ", d);
    }
    if (d < dim) g.outer *= whole.dim(d);
    if (d > dim) g.inner *= whole.dim(d);
  }
  return g;
}

// Calls copy(whole offset, part offset, elements) for every contiguous run of the slice.
template <typename Copy>
void for_each_run(const Geometry& g, Copy&& copy) {
  for (std::int64_t o = 0; o < g.outer; ++o) {
    std::int64_t p = o * g.part_along;
    for (const auto& [begin, count] : g.runs) {
      copy((o * g.along + begin) * g.inner, p * g.inner, count * g.inner);
      p += count;
    }
  }
}

}  // namespace

void take_slice(const Tensor& whole, const Parameter::InitSlice& slice, const Tensor& part) {
  const Geometry g = slice_geometry(whole, slice, part);
  const float* src = whole.data_as<float>();
  float* dst = part.data_as<float>();
  for_each_run(g, [&](std::int64_t w, std::int64_t p, std::int64_t n) { std::copy_n(src + w, n, dst + p); });
}

void put_slice(const Tensor& part, const Parameter::InitSlice& slice, const Tensor& whole) {
  const Geometry g = slice_geometry(whole, slice, part);
  const float* src = part.data_as<float>();
  float* dst = whole.data_as<float>();
  for_each_run(g, [&](std::int64_t w, std::int64_t p, std::int64_t n) { std::copy_n(src + p, n, dst + w); });
}

}  // namespace tutti::nn
