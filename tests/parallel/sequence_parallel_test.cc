// Sequence parallelism (parallel/sequence_parallel.h) on thread ranks: the split's gather and
// reduce-scatter put the rows where they belong; a residual MLP block a user builds from the
// sequence-parallel layers (a LayerNorm, a column- and a row-parallel Linear), fed this rank's
// rows, gives the unsplit block's output rows and input-gradient rows, the LayerNorm's whole
// parameter gradients and the Linears' slices of theirs; rows that do not divide run unsplit;
// a split over another group than the layer's is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tutti/comm/thread_group.h"
#include "tutti/core/error.h"
#include "tutti/kernels/threads.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/sequential.h"
#include "tutti/parallel/sequence_parallel.h"
#include "tutti/parallel/tensor_parallel.h"

namespace tutti::parallel {
namespace {

constexpr std::int64_t kB = 2, kT = 6, kC = 8, kHidden = 24;
constexpr std::uint64_t kSeed = 3;

// Deterministic values in [-1, 1).
std::vector<float> values(std::int64_t n, int salt) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<float>((i * 37 + salt * 11) % 23) / 11.5f - 1.0f;
  return v;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

// Rows [first, first + n) of a row-major tensor of `width` columns.
std::vector<float> rows_of(const std::vector<float>& v, std::int64_t width, std::int64_t first, std::int64_t n) {
  return {v.begin() + first * width, v.begin() + (first + n) * width};
}

TEST(SequenceParallel, GatherAndScatterPutTheRowsInRankOrder) {
  ThreadGroup group(2);
  group.run([&](int r) {
    SequenceParallel sp(group.communicator(r));
    EXPECT_FALSE(sp.begin(1, 3)) << "3 rows do not divide by 2";
    EXPECT_THROW(sp.local_shape(kC), Error);
    ASSERT_TRUE(sp.begin(kB, kT));
    EXPECT_EQ(sp.local_shape(kC), (Shape{kB * kT / 2, kC}));
    // Each rank's rows hold its rank + the row's index: gathered, rank 0's rows come first.
    std::vector<float> mine;
    for (std::int64_t i = 0; i < kB * kT / 2 * kC; ++i) mine.push_back(static_cast<float>(100 * r + i));
    const Tensor whole = sp.gather(Tensor::from_floats(mine, sp.local_shape(kC)), 0, Stream(), "test gather");
    EXPECT_EQ(whole.shape(), (Shape{kB, kT, kC}));
    const std::vector<float> all = whole.to_floats();
    const std::size_t half = all.size() / 2;
    for (std::size_t i = 0; i < half; ++i) {
      ASSERT_EQ(all[i], static_cast<float>(i)) << "rank 0's rows first";
      ASSERT_EQ(all[half + i], static_cast<float>(100 + i)) << "then rank 1's";
    }
    EXPECT_GE(sp.workspace_bytes(), kB * kT * kC * 4);
    // The sum over the group of a whole tensor, this rank's rows of it.
    const std::vector<float> w = values(kB * kT * kC, 1 + r), other = values(kB * kT * kC, 2 - r);
    const Tensor rows = Tensor::empty(sp.local_shape(kC), DType::f32);
    sp.scatter_sum(Tensor::from_floats(w, {kB, kT, kC}), rows, Stream(), "test scatter");
    std::vector<float> sum(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) sum[i] = w[i] + other[i];
    EXPECT_LT(max_diff(rows.to_floats(), rows_of(sum, kC, r * kB * kT / 2, kB * kT / 2)), 1e-6);
  });
}

struct Result {
  std::vector<float> y, dx, gamma_grad, beta_grad, w1_grad, w2_grad;
};

// One forward and backward of Residual(LayerNorm, Linear(C, H), GELU, Linear(H, C)) (split when
// `sp` is given) on `x`, with the output gradient `dy` (this rank's rows of them when split).
Result run_block(nn::Module& block, nn::LayerNorm& norm, nn::Linear& first, nn::Linear& second, const Tensor& x,
                 const Tensor& dy) {
  block.set_input_grad(true);
  Result out;
  out.y = block.forward(x).to_floats();
  out.dx = block.backward(dy).to_floats();
  out.gamma_grad = norm.gamma.grad.to_floats();
  out.beta_grad = norm.beta.grad.to_floats();
  out.w1_grad = first.weight.grad.to_floats();
  out.w2_grad = second.weight.grad.to_floats();
  return out;
}

TEST(SequenceParallel, AResidualMlpBlockOnItsRowsEqualsTheUnsplitBlock) {
  kernels::set_cpu_threads(1);
  const std::vector<float> x = values(kB * kT * kC, 5), dy = values(kB * kT * kC, 7);
  Result whole;
  {
    nn::Residual block;
    block.body().add<nn::LayerNorm>(kC).add<nn::Linear>(kC, kHidden).add<nn::GELU>().add<nn::Linear>(kHidden, kC);
    block.init(kSeed);
    auto& body = block.body();
    whole = run_block(block, dynamic_cast<nn::LayerNorm&>(*body.children()[0].second),
                      dynamic_cast<nn::Linear&>(*body.children()[1].second),
                      dynamic_cast<nn::Linear&>(*body.children()[3].second), Tensor::from_floats(x, {kB, kT, kC}),
                      Tensor::from_floats(dy, {kB, kT, kC}));
  }
  for (const int tp : {2, 3}) {
    ThreadGroup group(tp);
    group.run([&](int r) {
      Communicator& comm = group.communicator(r);
      SequenceParallel sp(comm);
      nn::Residual block;
      block.body()
          .add<SequenceParallelLayerNorm>(sp, kC)
          .add<ColumnParallelLinear>(comm, kC, kHidden, nn::LinearOptions{}, std::vector<std::int64_t>{}, &sp)
          .add<nn::GELU>()
          .add<RowParallelLinear>(comm, kHidden, kC, nn::LinearOptions{}, &sp);
      block.init(kSeed);
      // The region's first layer starts the split (the models' embeddings do); then this rank's rows.
      ASSERT_TRUE(sp.begin(kB, kT));
      const std::int64_t n = kB * kT / tp, first = r * n;
      auto& body = block.body();
      const Result s = run_block(block, dynamic_cast<nn::LayerNorm&>(*body.children()[0].second),
                                 dynamic_cast<nn::Linear&>(*body.children()[1].second),
                                 dynamic_cast<nn::Linear&>(*body.children()[3].second),
                                 Tensor::from_floats(rows_of(x, kC, first, n), {n, kC}),
                                 Tensor::from_floats(rows_of(dy, kC, first, n), {n, kC}));
      const std::string at = "tp " + std::to_string(tp) + " rank " + std::to_string(r);
      EXPECT_LT(max_diff(s.y, rows_of(whole.y, kC, first, n)), 1e-5) << at << ": this rank's output rows";
      EXPECT_LT(max_diff(s.dx, rows_of(whole.dx, kC, first, n)), 1e-5) << at << ": its input-gradient rows";
      EXPECT_LT(max_diff(s.gamma_grad, whole.gamma_grad), 1e-5) << at << ": the norm's, summed over the group";
      EXPECT_LT(max_diff(s.beta_grad, whole.beta_grad), 1e-5) << at;
      const std::int64_t part = kHidden / tp;
      EXPECT_LT(max_diff(s.w1_grad, rows_of(whole.w1_grad, kC, r * part, part)), 1e-5) << at << ": its rows of W1's";
      std::vector<float> columns;  // this rank's columns of W2's [C, H] gradient
      for (std::int64_t row = 0; row < kC; ++row)
        for (std::int64_t col = r * part; col < (r + 1) * part; ++col)
          columns.push_back(whole.w2_grad[static_cast<std::size_t>(row * kHidden + col)]);
      EXPECT_LT(max_diff(s.w2_grad, columns), 1e-5) << at << ": its columns of W2's";
    });
  }
}

TEST(SequenceParallel, RowsThatDoNotDivideRunUnsplitAndAnotherGroupIsRefused) {
  // 1 x 3 rows over 2 ranks: begin says no, and the block runs as tensor parallelism without the
  // split (whole rows on every rank, the unsplit block's output).
  ThreadGroup group(2);
  const std::vector<float> x = values(3 * kC, 9);
  std::vector<std::vector<float>> outputs(2);
  group.run([&](int r) {
    Communicator& comm = group.communicator(r);
    SequenceParallel sp(comm);
    nn::Sequential block;
    block.add<SequenceParallelLayerNorm>(sp, kC)
        .add<ColumnParallelLinear>(comm, kC, kHidden, nn::LinearOptions{}, std::vector<std::int64_t>{}, &sp)
        .add<RowParallelLinear>(comm, kHidden, kC, nn::LinearOptions{}, &sp);
    block.init(kSeed);
    EXPECT_FALSE(sp.begin(1, 3));
    outputs[static_cast<std::size_t>(r)] = block.forward(Tensor::from_floats(x, {1, 3, kC})).to_floats();
    EXPECT_EQ(outputs[static_cast<std::size_t>(r)].size(), static_cast<std::size_t>(3 * kC));
  });
  EXPECT_EQ(outputs[0], outputs[1]) << "every rank has the whole rows";
  ThreadGroup one(1), other(1);
  SequenceParallel sp(other.communicator(0));
  try {
    ColumnParallelLinear layer(one.communicator(0), kC, kHidden, {}, {}, &sp);
    FAIL() << "a split over another group was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("over another group than the layer's"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tutti::parallel
