// Cross-entropy family: CPU against a naive double-precision softmax and finite
// differences; the CUDA twin against the CPU (skipped where no GPU is visible). The split pieces
// (classes across ranks) over uneven parts, the ranks' reductions done on the host, against the
// whole rows' loss.
#include "tutti/kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/kernel_test_util.h"

namespace tutti::kernels {
namespace {

using std::int64_t;
using testing::default_rtol;
using testing::expect_close;
using testing::kFloatDtypes;
using testing::random_tensor;

const std::pair<int64_t, int64_t> kShapes[] = {{1, 1}, {7, 5}, {33, 129}, {129, 33}, {4, 1000}, {2, 2}};

struct Naive {
  double loss = 0;
  std::vector<double> dlogits;
};

// Mean over counted rows of logsumexp(row) - row[label], and its gradient times grad_scale.
Naive naive_ce(const std::vector<float>& logits, const std::vector<int64_t>& labels, int64_t C, int64_t ignore,
               double grad_scale) {
  const int64_t N = static_cast<int64_t>(labels.size());
  Naive out;
  out.dlogits.assign(logits.size(), 0.0);
  int64_t counted = 0;
  for (int64_t l : labels) counted += l != ignore;
  for (int64_t r = 0; r < N; ++r) {
    const int64_t label = labels[static_cast<std::size_t>(r)];
    if (label == ignore) continue;
    const float* row = logits.data() + r * C;
    double mx = row[0];
    for (int64_t c = 1; c < C; ++c) mx = std::max(mx, double(row[c]));
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(double(row[c]) - mx);
    out.loss += std::log(sum) + mx - row[label];
    for (int64_t c = 0; c < C; ++c)
      out.dlogits[static_cast<std::size_t>(r * C + c)] =
          grad_scale * (std::exp(double(row[c]) - mx) / sum - (c == label ? 1.0 : 0.0)) / double(counted);
  }
  if (counted > 0) out.loss /= double(counted);
  return out;
}

std::vector<float> to_f(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Labels in [0, C) with every third row ignored (when there are several rows).
Tensor labels_with_ignored(int64_t N, int64_t C, DType dtype, std::uint32_t seed, int64_t ignore) {
  std::vector<int64_t> v = testing::random_labels(N, C, DType::i64, seed).to_ints();
  if (N > 1)
    for (int64_t r = 1; r < N; r += 3) v[static_cast<std::size_t>(r)] = ignore;
  return Tensor::from_ints(v, {N}, dtype);
}

// Labels for count_correct: every other counted row gets its logits' argmax, so that both
// correct and wrong rows occur (rows 1, 4, 7... are ignored, -100). As i64 values.
std::vector<int64_t> labels_half_argmax(const Tensor& logits, int64_t N, int64_t C, std::uint32_t seed) {
  std::vector<int64_t> lv = labels_with_ignored(N, C, DType::i64, seed, -100).to_ints();
  const std::vector<float> fv = logits.to_floats();
  for (int64_t r = 0; r < N; r += 2)
    if (lv[static_cast<std::size_t>(r)] != -100) {
      const auto row = fv.begin() + r * C;
      lv[static_cast<std::size_t>(r)] = std::max_element(row, row + C) - row;
    }
  return lv;
}

// Absolute floor for comparing dlogits: fp32 rounding at the largest value, and f16's
// subnormal spacing (2^-24) for the many tiny probabilities.
double dlogits_atol(DType d, double max_abs_value) {
  return std::max(1e-6 * max_abs_value, d == DType::f16 ? 1.2e-7 : 0.0);
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST(CrossEntropyCpu, MatchesNaive) {
  std::uint32_t seed = 1;
  for (DType d : kFloatDtypes)
    for (DType ld : {DType::i32, DType::i64})
      for (auto [N, C] : kShapes)
        for (float grad_scale : {1.0f, 1024.0f}) {
          const int64_t ignore = (seed % 2) ? -100 : 3;  // also a non-default ignore_index
          const Tensor logits = random_tensor({N, C}, d, seed++, -4.f, 4.f);
          const Tensor labels = labels_with_ignored(N, C, ld, seed++, ignore == 3 && C > 3 ? 3 : -100);
          const int64_t used_ignore = ignore == 3 && C > 3 ? 3 : -100;
          const Tensor loss = testing::poisoned({1}, DType::f32), dlogits = testing::poisoned({N, C}, d);
          softmax_cross_entropy(logits, labels, loss, dlogits, {.ignore_index = used_ignore, .grad_scale = grad_scale});
          const Naive want = naive_ce(logits.to_floats(), labels.to_ints(), C, used_ignore, grad_scale);
          const std::string what = std::string(name_of(d)) + " labels " + std::string(name_of(ld)) +
                                   " N=" + std::to_string(N) + " C=" + std::to_string(C) +
                                   " scale=" + std::to_string(grad_scale);
          expect_close(loss.to_floats(), {static_cast<float>(want.loss)}, 1e-5, 1e-6, "loss " + what);
          const double rtol = d == DType::f32 ? 1e-5 : default_rtol(d);
          expect_close(dlogits.to_floats(), to_f(want.dlogits), rtol, dlogits_atol(d, max_abs(want.dlogits)),
                       "dlogits " + what);
          // Without dlogits: the same loss.
          const Tensor loss_only = testing::poisoned({1}, DType::f32);
          softmax_cross_entropy(logits, labels, loss_only, Tensor(), {.ignore_index = used_ignore});
          expect_close(loss_only.to_floats(), loss.to_floats(), 0, 0, "loss without dlogits " + what);
        }
}

TEST(CrossEntropyCpu, AllRowsIgnoredGivesZero) {
  const Tensor logits = random_tensor({5, 4}, DType::f32, 3);
  const Tensor labels = Tensor::from_ints({-100, -100, -100, -100, -100}, {5}, DType::i64);
  const Tensor loss = testing::poisoned({1}, DType::f32), dlogits = testing::poisoned({5, 4}, DType::f32);
  softmax_cross_entropy(logits, labels, loss, dlogits);
  expect_close(loss.to_floats(), {0.0f}, 0, 0, "loss");
  expect_close(dlogits.to_floats(), std::vector<float>(20, 0.0f), 0, 0, "dlogits");
}

TEST(CrossEntropyCpu, StableForLargeLogits) {
  // Shifting every logit of a row by a constant changes nothing; exp(1000) would overflow.
  const Tensor logits = random_tensor({3, 7}, DType::f32, 4);
  std::vector<float> shifted = logits.to_floats();
  for (std::size_t i = 0; i < shifted.size(); ++i) shifted[i] += (i < 7 ? 1000.0f : -1000.0f);
  const Tensor labels = testing::random_labels(3, 7, DType::i32, 5);
  const Tensor l0 = Tensor::empty({1}, DType::f32), l1 = Tensor::empty({1}, DType::f32);
  const Tensor d0 = Tensor::empty({3, 7}, DType::f32), d1 = Tensor::empty({3, 7}, DType::f32);
  softmax_cross_entropy(logits, labels, l0, d0);
  softmax_cross_entropy(Tensor::from_floats(shifted, {3, 7}), labels, l1, d1);
  // The shifted logits are rounded to fp32 ulps of 1000 (6e-5): compare at that scale.
  expect_close(l1.to_floats(), l0.to_floats(), 1e-3, 1e-4, "loss with shifted logits");
  expect_close(d1.to_floats(), d0.to_floats(), 1e-3, 1e-4, "dlogits with shifted logits");
}

TEST(CrossEntropyCpu, GradientMatchesFiniteDifferences) {
  const int64_t N = 4, C = 6;
  const Tensor logits = random_tensor({N, C}, DType::f32, 8, -2.f, 2.f);
  const Tensor labels = Tensor::from_ints({2, -100, 0, 5}, {N}, DType::i32);
  const std::vector<int64_t> lv = labels.to_ints();
  auto loss = [&] { return naive_ce(logits.to_floats(), lv, C, -100, 1.0).loss; };
  const Tensor l = Tensor::empty({1}, DType::f32), dlogits = testing::poisoned({N, C}, DType::f32);
  softmax_cross_entropy(logits, labels, l, dlogits);
  const std::vector<double> num = testing::numeric_gradient(logits, loss);
  expect_close(dlogits.to_floats(), to_f(num), 1e-3, 1e-4, "dlogits vs finite differences");
}

TEST(CrossEntropyCpu, OutOfRangeLabelThrowsBeforeWriting) {
  const Tensor logits = random_tensor({3, 4}, DType::f32, 9);
  const Tensor loss = Tensor::from_floats({7.0f}, {1}), dlogits = Tensor::zeros({3, 4}, DType::f32);
  for (int64_t bad : {4, -1, 1000}) {
    const Tensor labels = Tensor::from_ints({0, bad, 2}, {3}, DType::i64);
    try {
      softmax_cross_entropy(logits, labels, loss, dlogits);
      ADD_FAILURE() << "label " << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("softmax_cross_entropy"), std::string::npos) << msg;
      EXPECT_NE(msg.find("row 1"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(loss.to_floats()[0], 7.0f);
  for (float v : dlogits.to_floats()) EXPECT_EQ(v, 0.0f);
}

// ---- The classes split across ranks ----

// Columns [cuts[i], cuts[i + 1]) of the [N, C] values, as a tensor of dtype d on `device`.
Tensor columns_of(const std::vector<float>& all, int64_t N, int64_t C, int64_t from, int64_t to, DType d,
                  Device device) {
  std::vector<float> part;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = from; c < to; ++c) part.push_back(all[static_cast<std::size_t>(r * C + c)]);
  return Tensor::from_floats(part, {N, to - from}, d).to(device);
}

struct SplitResult {
  std::vector<float> losses;   // each part's loss (all the same, the whole rows')
  std::vector<float> dlogits;  // [N, C], the parts' columns put back together
};

// The three split pieces over the parts [cuts[i], cuts[i + 1]) of the logits' columns, the
// reductions over the "ranks" done here on the host (max, then sum), as
// parallel::VocabParallelCrossEntropy's allreduces do.
SplitResult split_ce(const Tensor& logits, const Tensor& labels, const std::vector<int64_t>& cuts,
                     const CrossEntropyOptions& opt, Device device) {
  const int64_t N = logits.dim(0), C = logits.dim(1);
  const std::vector<float> all = logits.to_floats();
  const Stream s = device.is_cpu() ? Stream() : Stream::default_for(device);
  const Tensor y = labels.to(device);
  std::vector<Tensor> parts;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i)
    parts.push_back(columns_of(all, N, C, cuts[i], cuts[i + 1], logits.dtype(), device));
  std::vector<float> mx(static_cast<std::size_t>(N), -INFINITY), sums(static_cast<std::size_t>(2 * N), 0.0f);
  for (const Tensor& part : parts) {
    const Tensor m = testing::poisoned({N}, DType::f32, device);
    cross_entropy_local_max(part, m, s);
    const std::vector<float> v = m.to_floats();
    for (int64_t r = 0; r < N; ++r) mx[r] = std::max(mx[r], v[r]);
  }
  const Tensor row_max = Tensor::from_floats(mx, {N}).to(device);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Tensor part_sums = testing::poisoned({2, N}, DType::f32, device);
    cross_entropy_local_sums(parts[i], y, row_max, part_sums, {cuts[i], C}, opt.ignore_index, s);
    const std::vector<float> v = part_sums.to_floats();
    for (std::size_t k = 0; k < v.size(); ++k) sums[k] += v[k];
  }
  const Tensor all_sums = Tensor::from_floats(sums, {2, N}).to(device);
  SplitResult out;
  out.dlogits.assign(static_cast<std::size_t>(N * C), 0.0f);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const int64_t width = cuts[i + 1] - cuts[i];
    const Tensor loss = testing::poisoned({1}, DType::f32, device);
    const Tensor dl = testing::poisoned({N, width}, logits.dtype(), device);
    cross_entropy_from_sums(parts[i], y, row_max, all_sums, loss, dl, {cuts[i], C}, opt, s);
    out.losses.push_back(loss.to_floats()[0]);
    const std::vector<float> d = dl.to_floats();
    for (int64_t r = 0; r < N; ++r)
      for (int64_t c = 0; c < width; ++c)
        out.dlogits[static_cast<std::size_t>(r * C + cuts[i] + c)] = d[static_cast<std::size_t>(r * width + c)];
  }
  return out;
}

// Cuts of C columns into `parts` uneven parts (the last the widest; with few columns some parts
// are empty: a rank may hold none).
std::vector<int64_t> cuts_of(int64_t C, int parts) {
  std::vector<int64_t> cuts{0};
  for (int i = 1; i < parts; ++i) cuts.push_back(C * i / (parts + 1));
  cuts.push_back(C);
  return cuts;
}

TEST(CrossEntropySplitCpu, ThePiecesOverAnySplitGiveTheWholeLoss) {
  std::uint32_t seed = 500;
  for (DType d : kFloatDtypes)
    for (DType ld : {DType::i32, DType::i64})
      for (auto [N, C] : kShapes)
        for (int parts : {1, 2, 3}) {
          const Tensor logits = random_tensor({N, C}, d, seed++, -4.f, 4.f);
          const Tensor labels = labels_with_ignored(N, C, ld, seed++, -100);
          const CrossEntropyOptions opt{.ignore_index = -100, .grad_scale = 64.0f};
          const Naive want = naive_ce(logits.to_floats(), labels.to_ints(), C, -100, opt.grad_scale);
          const SplitResult got = split_ce(logits, labels, cuts_of(C, parts), opt, Device::cpu());
          const std::string what = std::string(name_of(d)) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
                                   " parts=" + std::to_string(parts);
          for (float l : got.losses) expect_close({l}, {static_cast<float>(want.loss)}, 1e-5, 1e-6, "loss " + what);
          expect_close(got.dlogits, to_f(want.dlogits), d == DType::f32 ? 1e-5 : default_rtol(d),
                       dlogits_atol(d, max_abs(want.dlogits)), "dlogits " + what);
        }
}

TEST(CrossEntropySplitCpu, LabelsAreCheckedAgainstTheWholeWidth) {
  // Columns [4, 8) of 8: label 6 is this part's, label 1 another's (picked 0 here), 8 is none.
  const Tensor logits = random_tensor({2, 4}, DType::f32, 9);
  const Tensor row_max = Tensor::from_floats({5.0f, 5.0f}, {2}), sums = Tensor::zeros({2, 2}, DType::f32);
  cross_entropy_local_sums(logits, Tensor::from_ints({6, 1}, {2}, DType::i64), row_max, sums, {4, 8});
  const std::vector<float> l = logits.to_floats(), v = sums.to_floats();
  EXPECT_EQ(v[2], l[2]) << "row 0's label, column 2 of this part";
  EXPECT_EQ(v[3], 0.0f) << "row 1's label lies in another part";
  const Tensor loss = Tensor::zeros({1}, DType::f32);
  for (const auto& bad : {std::vector<int64_t>{0, 8}, std::vector<int64_t>{-1, 0}}) {
    const Tensor labels = Tensor::from_ints(bad, {2}, DType::i64);
    EXPECT_THROW(cross_entropy_local_sums(logits, labels, row_max, sums, {4, 8}), InvalidArgument);
    EXPECT_THROW(cross_entropy_from_sums(logits, labels, row_max, sums, loss, Tensor(), {4, 8}), InvalidArgument);
  }
  // Columns that do not lie within the whole width.
  EXPECT_THROW(cross_entropy_local_sums(logits, Tensor::from_ints({6, 1}, {2}, DType::i64), row_max, sums, {6, 8}),
               InvalidArgument);
}

// Rows whose argmax (the first, on ties) equals the label, skipping ignored rows.
int64_t naive_correct(const std::vector<float>& logits, const std::vector<int64_t>& labels, int64_t C, int64_t ignore) {
  int64_t hits = 0;
  for (std::size_t r = 0; r < labels.size(); ++r) {
    if (labels[r] == ignore) continue;
    const auto row = logits.begin() + static_cast<std::ptrdiff_t>(r) * C;
    hits += std::max_element(row, row + C) - row == labels[r];
  }
  return hits;
}

TEST(CountCorrectCpu, MatchesNaiveAndAccumulates) {
  std::uint32_t seed = 300;
  for (DType d : kFloatDtypes)
    for (DType ld : {DType::i32, DType::i64})
      for (auto [N, C] : kShapes) {
        const Tensor logits = random_tensor({N, C}, d, seed++);
        const std::vector<int64_t> lv = labels_half_argmax(logits, N, C, seed++);
        const std::vector<float> fv = logits.to_floats();
        const Tensor labels = Tensor::from_ints(lv, {N}, ld);
        const int64_t want = naive_correct(fv, lv, C, -100);
        const Tensor correct = Tensor::from_ints({-5}, {1}, DType::i64);
        count_correct(logits, labels, correct, false);
        const std::string what = std::string(name_of(d)) + " N=" + std::to_string(N) + " C=" + std::to_string(C);
        EXPECT_EQ(correct.to_ints()[0], want) << what;
        count_correct(logits, labels, correct, true);
        EXPECT_EQ(correct.to_ints()[0], 2 * want) << what << " accumulated";
      }
  // Ties go to the first maximum; an out-of-range label is never correct.
  const Tensor logits = Tensor::from_floats({1, 3, 3, 0, 0, 0}, {2, 3});
  const Tensor correct = Tensor::zeros({1}, DType::i64);
  count_correct(logits, Tensor::from_ints({1, 0}, {2}, DType::i32), correct, false);
  EXPECT_EQ(correct.to_ints()[0], 2);
  count_correct(logits, Tensor::from_ints({2, 7}, {2}, DType::i32), correct, false);
  EXPECT_EQ(correct.to_ints()[0], 0);
}

TEST(CrossEntropyCpu, BadInputsThrowNamingTheOp) {
  using testing::expect_invalid_argument;
  const Tensor logits = random_tensor({3, 4}, DType::f32, 1);
  const Tensor labels = Tensor::from_ints({0, 1, 2}, {3}, DType::i32);
  const Tensor loss = Tensor::zeros({1}, DType::f32), dlogits = Tensor::zeros({3, 4}, DType::f32);
  const char* op = "softmax_cross_entropy";
  expect_invalid_argument([&] { softmax_cross_entropy(logits, Tensor::zeros({3}, DType::f32), loss, dlogits); }, op);
  expect_invalid_argument([&] { softmax_cross_entropy(logits, Tensor::from_ints({0, 1}, {2}), loss, dlogits); }, op);
  expect_invalid_argument([&] { softmax_cross_entropy(logits, labels, Tensor::zeros({2}, DType::f32), dlogits); }, op);
  expect_invalid_argument([&] { softmax_cross_entropy(logits, labels, Tensor::zeros({1}, DType::f16), dlogits); }, op);
  expect_invalid_argument([&] { softmax_cross_entropy(logits, labels, loss, Tensor::zeros({3, 4}, DType::f16)); }, op);
  expect_invalid_argument([&] { softmax_cross_entropy(logits, labels, loss, Tensor::zeros({4, 3}, DType::f32)); }, op);
  expect_invalid_argument([&] { softmax_cross_entropy(random_tensor({12}, DType::f32, 2), labels, loss, Tensor()); },
                          op);
  expect_invalid_argument([&] { softmax_cross_entropy(logits, labels, Tensor(), dlogits); }, op);
  expect_invalid_argument([&] { softmax_cross_entropy(logits, testing::fake_gpu_tensor(labels), loss, dlogits); }, op);
  expect_invalid_argument([&] { count_correct(logits, labels, Tensor::zeros({1}, DType::i32), false); },
                          "count_correct");
  expect_invalid_argument(
      [&] { count_correct(logits, Tensor::from_ints({0}, {1}), Tensor::zeros({1}, DType::i64), false); },
      "count_correct");
  EXPECT_EQ(loss.to_floats()[0], 0.0f);
  for (float v : dlogits.to_floats()) EXPECT_EQ(v, 0.0f);
}

// ---- CUDA twin: the GPU result against the CPU one ------------------------------------

Tensor gpu(const Tensor& t) { return t.to(Device::cuda(0)); }
Tensor gpu_poisoned(const Shape& s, DType d) { return testing::poisoned(s, d, Device::cuda(0)); }

TEST(CrossEntropyCuda, MatchesCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 1000;
  // A vocabulary-sized row (GPT-2's 50257: blocks of 1024 threads loop ~49 times, the last pass
  // partial), and more rows than the 1024 threads that count them and sum their losses (3000: 3
  // passes). On the emulated device, where every thread is a fiber and the hazard detector checks
  // every access, 5003 takes the same path (1024 threads, 5 passes, the last partial) and 1100
  // rows loop too (2 passes, the last partial), at half the time (~19 s there before).
  const bool emu = testing::on_emulated_device();
  const int64_t vocab = emu ? 5003 : 50257, many_rows = emu ? 1100 : 3000;
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},    {7, 5},      {33, 129},      {129, 33},
                                                {4, 1000}, {64, vocab}, {many_rows, 10}};
  for (DType d : kFloatDtypes)
    for (DType ld : {DType::i32, DType::i64})
      for (auto [N, C] : shapes) {
        const Tensor logits = random_tensor({N, C}, d, seed++, -4.f, 4.f);
        const Tensor labels = labels_with_ignored(N, C, ld, seed++, -100);
        const CrossEntropyOptions opt{.ignore_index = -100, .grad_scale = 512.0f};
        const Tensor loss_c = testing::poisoned({1}, DType::f32), dl_c = testing::poisoned({N, C}, d);
        softmax_cross_entropy(logits, labels, loss_c, dl_c, opt);
        const Stream s = Stream::create(Device::cuda(0));
        const Tensor loss_g = gpu_poisoned({1}, DType::f32), dl_g = gpu_poisoned({N, C}, d);
        softmax_cross_entropy(gpu(logits), gpu(labels), loss_g, dl_g, opt, s);
        s.synchronize();
        const std::string what = std::string(name_of(d)) + " labels " + std::string(name_of(ld)) +
                                 " N=" + std::to_string(N) + " C=" + std::to_string(C);
        expect_close(loss_g.to_floats(), loss_c.to_floats(), 1e-5, 1e-6, "cuda loss " + what);
        const std::vector<float> dc = dl_c.to_floats();
        double m = 0;
        for (float v : dc) m = std::max(m, double(std::fabs(v)));
        expect_close(dl_g.to_floats(), dc, d == DType::f32 ? 1e-5 : default_rtol(d), dlogits_atol(d, m),
                     "cuda dlogits " + what);
        // Loss alone.
        const Tensor loss_only = gpu_poisoned({1}, DType::f32);
        softmax_cross_entropy(gpu(logits), gpu(labels), loss_only, Tensor(), opt, Stream::default_for(Device::cuda(0)));
        expect_close(loss_only.to_floats(), loss_c.to_floats(), 1e-5, 1e-6, "cuda loss only " + what);
      }
}

TEST(CrossEntropyCuda, AllIgnoredAndOutOfRange) {
  TUTTI_REQUIRE_GPU();
  const Tensor logits = gpu(random_tensor({5, 4}, DType::f32, 3));
  const Tensor loss = gpu_poisoned({1}, DType::f32), dlogits = gpu_poisoned({5, 4}, DType::f32);
  softmax_cross_entropy(logits, gpu(Tensor::from_ints({-100, -100, -100, -100, -100}, {5}, DType::i64)), loss, dlogits,
                        {}, Stream::default_for(Device::cuda(0)));
  expect_close(loss.to_floats(), {0.0f}, 0, 0, "cuda loss, all ignored");
  expect_close(dlogits.to_floats(), std::vector<float>(20, 0.0f), 0, 0, "cuda dlogits, all ignored");
  // The host cannot see device labels: an out-of-range label makes the loss nan.
  softmax_cross_entropy(logits, gpu(Tensor::from_ints({0, 1, 9, 2, 3}, {5}, DType::i32)), loss, dlogits, {},
                        Stream::default_for(Device::cuda(0)));
  EXPECT_TRUE(std::isnan(loss.to_floats()[0]));
}

TEST(CrossEntropySplitCuda, ThePiecesMatchTheCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 3000;
  const int64_t vocab = testing::on_emulated_device() ? 5003 : 50257;
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {7, 5}, {33, 129}, {16, vocab}};
  for (DType d : kFloatDtypes)
    for (auto [N, C] : shapes)
      for (int parts : {1, 3}) {
        const Tensor logits = random_tensor({N, C}, d, seed++, -4.f, 4.f);
        const Tensor labels = labels_with_ignored(N, C, DType::i32, seed++, -100);
        const CrossEntropyOptions opt{.ignore_index = -100, .grad_scale = 512.0f};
        const SplitResult want = split_ce(logits, labels, cuts_of(C, parts), opt, Device::cpu());
        const SplitResult got = split_ce(logits, labels, cuts_of(C, parts), opt, Device::cuda(0));
        const std::string what = std::string(name_of(d)) + " N=" + std::to_string(N) + " C=" + std::to_string(C) +
                                 " parts=" + std::to_string(parts);
        expect_close(got.losses, want.losses, 1e-5, 1e-6, "cuda loss " + what);
        double m = 0;
        for (float v : want.dlogits) m = std::max(m, double(std::fabs(v)));
        expect_close(got.dlogits, want.dlogits, d == DType::f32 ? 1e-5 : default_rtol(d), dlogits_atol(d, m),
                     "cuda dlogits " + what);
      }
  // A label outside the whole width makes the loss nan (the host cannot read device labels).
  const SplitResult bad = split_ce(random_tensor({2, 6}, DType::f32, 1), Tensor::from_ints({1, 6}, {2}, DType::i32),
                                   {0, 3, 6}, {}, Device::cuda(0));
  EXPECT_TRUE(std::isnan(bad.losses[0]) && std::isnan(bad.losses[1]));
}

TEST(CountCorrectCuda, MatchesCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 2000;
  // 256 rows of a vocabulary (a warp loops ~1571 times over 50257); 5003 on the emulated device
  // (157 times, the last partial), as above. 5000 rows: the grid loops over rows.
  const int64_t vocab = testing::on_emulated_device() ? 5003 : 50257;
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {7, 5}, {33, 129}, {4, 1000}, {256, vocab}, {5000, 10}};
  for (DType d : kFloatDtypes)
    for (auto [N, C] : shapes) {
      const Tensor logits = random_tensor({N, C}, d, seed++);
      const std::vector<int64_t> lv = labels_half_argmax(logits, N, C, seed++);
      for (DType ld : {DType::i32, DType::i64}) {
        const Tensor labels = Tensor::from_ints(lv, {N}, ld);
        const Tensor c_cpu = Tensor::from_ints({11}, {1}, DType::i64);
        count_correct(logits, labels, c_cpu, true);
        const Tensor c_gpu = gpu(Tensor::from_ints({11}, {1}, DType::i64));
        count_correct(gpu(logits), gpu(labels), c_gpu, true, -100, Stream::default_for(Device::cuda(0)));
        EXPECT_EQ(c_gpu.to_ints()[0], c_cpu.to_ints()[0]) << name_of(d) << " N=" << N << " C=" << C;
        count_correct(gpu(logits), gpu(labels), c_gpu, false, -100, Stream::default_for(Device::cuda(0)));
        EXPECT_EQ(c_gpu.to_ints()[0], c_cpu.to_ints()[0] - 11) << name_of(d) << " N=" << N << " C=" << C << " fresh";
      }
    }
}

}  // namespace
}  // namespace tutti::kernels
