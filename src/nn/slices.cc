#include "nn/slices.h"

#include <algorithm>
#include <utility>

#include "tutti/core/error.h"

namespace tutti::nn {

namespace {

// Checks that a slice of `count` along `dim` from `begin` fits `whole` and `part`; returns the
// products of whole's dimensions before and after `dim`.
std::pair<std::int64_t, std::int64_t> slice_geometry(const Tensor& whole, int dim, std::int64_t begin,
                                                     const Tensor& part) {
  const Shape& full = whole.shape();
  TUTTI_CHECK_ARG(dim >= 0 && dim < whole.ndim() && part.ndim() == whole.ndim() &&
                      begin + part.dim(dim) <= full[static_cast<std::size_t>(dim)],
                  "a slice ", part.str(), " from ", begin, " along dimension ", dim, " is not in ", whole.str());
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= full[static_cast<std::size_t>(d)];
  for (int d = dim + 1; d < whole.ndim(); ++d) inner *= full[static_cast<std::size_t>(d)];
  return {outer, inner};
}

}  // namespace

void take_slice(const Tensor& whole, int dim, std::int64_t begin, const Tensor& part) {
  const auto [outer, inner] = slice_geometry(whole, dim, begin, part);
  const std::int64_t count = part.dim(dim), along = whole.dim(dim);
  const float* src = whole.data_as<float>();
  float* dst = part.data_as<float>();
  for (std::int64_t o = 0; o < outer; ++o) {
    std::copy_n(src + (o * along + begin) * inner, count * inner, dst + o * count * inner);
  }
}

void put_slice(const Tensor& part, int dim, std::int64_t begin, const Tensor& whole) {
  const auto [outer, inner] = slice_geometry(whole, dim, begin, part);
  const std::int64_t count = part.dim(dim), along = whole.dim(dim);
  const float* src = part.data_as<float>();
  float* dst = whole.data_as<float>();
  for (std::int64_t o = 0; o < outer; ++o) {
    std::copy_n(src + o * count * inner, count * inner, dst + (o * along + begin) * inner);
  }
}

}  // namespace tutti::nn
