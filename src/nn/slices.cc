#include "nn/slices.h"

#include <algorithm>
#include <utility>

#include "tutti/core/error.h"

namespace tutti::nn {

namespace {

// A slice's shape along `dim`: `blocks` blocks of `block` elements in whole, `count` of each in
// part, from `begin`; `outer`, `inner` the products of whole's dimensions before and after dim.
struct Geometry {
  std::int64_t outer = 1, inner = 1, block = 0, count = 0;
};

Geometry slice_geometry(const Tensor& whole, int dim, std::int64_t begin, const Tensor& part, int blocks) {
  const Shape& full = whole.shape();
  TUTTI_CHECK_ARG(blocks >= 1 && dim >= 0 && dim < whole.ndim() && part.ndim() == whole.ndim() &&
                      whole.dim(dim) % blocks == 0 && part.dim(dim) % blocks == 0 &&
                      begin + part.dim(dim) / blocks <= whole.dim(dim) / blocks,
                  "a slice ", part.str(), " from ", begin, " along dimension ", dim, " (in each of ", blocks,
                  " block(s)) is not in ", whole.str());
  Geometry g;
  for (int d = 0; d < dim; ++d) g.outer *= full[static_cast<std::size_t>(d)];
  for (int d = dim + 1; d < whole.ndim(); ++d) g.inner *= full[static_cast<std::size_t>(d)];
  g.block = whole.dim(dim) / blocks;
  g.count = part.dim(dim) / blocks;
  return g;
}

// Calls copy(whole offset, part offset, elements) for every contiguous run of the slice.
template <typename Copy>
void for_each_run(const Geometry& g, std::int64_t begin, int blocks, Copy&& copy) {
  const std::int64_t along = g.block * blocks, part_along = g.count * blocks;
  for (std::int64_t o = 0; o < g.outer; ++o) {
    for (int b = 0; b < blocks; ++b) {
      copy((o * along + b * g.block + begin) * g.inner, (o * part_along + b * g.count) * g.inner, g.count * g.inner);
    }
  }
}

}  // namespace

void take_slice(const Tensor& whole, int dim, std::int64_t begin, const Tensor& part, int blocks) {
  const Geometry g = slice_geometry(whole, dim, begin, part, blocks);
  const float* src = whole.data_as<float>();
  float* dst = part.data_as<float>();
  for_each_run(g, begin, blocks,
               [&](std::int64_t w, std::int64_t p, std::int64_t n) { std::copy_n(src + w, n, dst + p); });
}

void put_slice(const Tensor& part, int dim, std::int64_t begin, const Tensor& whole, int blocks) {
  const Geometry g = slice_geometry(whole, dim, begin, part, blocks);
  const float* src = part.data_as<float>();
  float* dst = whole.data_as<float>();
  for_each_run(g, begin, blocks,
               [&](std::int64_t w, std::int64_t p, std::int64_t n) { std::copy_n(src + p, n, dst + w); });
}

}  // namespace tutti::nn
