// IDX reading: files the test writes itself (plain and gzip'ed), every kind of damage, and the
// real Fashion-MNIST files when Debian's package is installed.
#include "tutti/data/idx.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace tutti::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    path_ =
        fs::temp_directory_path() / ("tutti_idx_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// The IDX encoding, written independently of the reader: big-endian header, then data.
Bytes idx_bytes(std::uint8_t type, const std::vector<std::uint32_t>& dims, const Bytes& data) {
  Bytes out = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(d >> shift));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_raw(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

Bytes random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng() & 0xFF);
  return b;
}

// Runs f, expects InvalidArgument, returns its message.
template <typename F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InvalidArgument, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected InvalidArgument, nothing was thrown";
  return "";
}

struct Shape3 {
  std::uint32_t n, rows, cols;
};

class IdxImages : public ::testing::TestWithParam<std::tuple<bool, Shape3>> {};

TEST_P(IdxImages, ReadsBytesAsFloatsOverTwoFiftyFive) {
  const auto [gz, s] = GetParam();
  TempDir dir;
  const Bytes data = random_bytes(std::size_t{s.n} * s.rows * s.cols, s.n * 31 + s.rows);
  const std::string path = dir.file(gz ? "images.gz" : "images");
  if (gz)
    write_gz(path, idx_bytes(0x08, {s.n, s.rows, s.cols}, data));
  else
    write_raw(path, idx_bytes(0x08, {s.n, s.rows, s.cols}, data));

  const IdxArray raw = read_idx(path);
  EXPECT_EQ(raw.type, IdxType::u8);
  EXPECT_EQ(raw.dims, (std::vector<std::int64_t>{s.n, s.rows, s.cols}));
  EXPECT_EQ(raw.bytes, data);

  const Tensor t = read_idx_images(path);
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.shape(), (Shape{s.n, s.rows, s.cols}));
  const std::vector<float> v = t.to_floats();
  ASSERT_EQ(v.size(), data.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(v[i], static_cast<float>(data[i]) / 255.0f) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(PlainAndGzip, IdxImages,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(Shape3{1, 1, 1}, Shape3{5, 3, 4},
                                                                                 Shape3{17, 28, 28}, Shape3{3, 7, 1})));

TEST(Idx, ReadsLabelsAsInt32PlainAndGzip) {
  TempDir dir;
  for (bool gz : {false, true}) {
    for (std::uint32_t n : {1u, 9u, 1001u}) {
      const Bytes data = random_bytes(n, n + (gz ? 7 : 0));
      const std::string path = dir.file("labels" + std::to_string(n) + (gz ? ".gz" : ""));
      if (gz)
        write_gz(path, idx_bytes(0x08, {n}, data));
      else
        write_raw(path, idx_bytes(0x08, {n}, data));
      const Tensor t = read_idx_labels(path);
      EXPECT_EQ(t.dtype(), DType::i32);
      EXPECT_EQ(t.shape(), (Shape{n}));
      const auto v = t.to_ints();
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], data[i]) << path << " element " << i;
    }
  }
}

TEST(Idx, OtherElementTypesKeepTheirBigEndianBytes) {
  TempDir dir;
  // i32 [2, 3]: 24 bytes; f64 [5]: 40 bytes.
  const Bytes ints = random_bytes(24, 5);
  write_raw(dir.file("ints"), idx_bytes(0x0C, {2, 3}, ints));
  const IdxArray a = read_idx(dir.file("ints"));
  EXPECT_EQ(a.type, IdxType::i32);
  EXPECT_EQ(a.dims, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.bytes, ints);
  const Bytes doubles = random_bytes(40, 6);
  write_gz(dir.file("doubles.gz"), idx_bytes(0x0E, {5}, doubles));
  EXPECT_EQ(read_idx(dir.file("doubles.gz")).bytes, doubles);
  // Images and labels must be unsigned bytes of the right rank.
  EXPECT_NE(invalid_argument_message([&] { read_idx_images(dir.file("ints")); }).find("does not hold images"),
            std::string::npos);
  write_raw(dir.file("u8_2d"), idx_bytes(0x08, {2, 2}, random_bytes(4, 1)));
  EXPECT_NE(invalid_argument_message([&] { read_idx_labels(dir.file("u8_2d")); }).find("does not hold labels"),
            std::string::npos);
  write_raw(dir.file("u8_1d"), idx_bytes(0x08, {4}, random_bytes(4, 1)));
  EXPECT_NE(invalid_argument_message([&] { read_idx_images(dir.file("u8_1d")); }).find("does not hold images"),
            std::string::npos);
}

TEST(Idx, ZeroSamplesIsAValidFile) {
  TempDir dir;
  write_raw(dir.file("empty"), idx_bytes(0x08, {0, 28, 28}, {}));
  const Tensor t = read_idx_images(dir.file("empty"));
  EXPECT_EQ(t.shape(), (Shape{0, 28, 28}));
}

TEST(Idx, MissingFileNamesThePath) {
  TempDir dir;
  const std::string path = dir.file("no-such-file.gz");
  const std::string msg = invalid_argument_message([&] { read_idx(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  EXPECT_NE(invalid_argument_message([&] { read_idx(dir.str()); }).find("is a directory"), std::string::npos);
}

TEST(Idx, TruncatedDataIsRefusedPlainAndGzip) {
  TempDir dir;
  const Bytes full = idx_bytes(0x08, {10, 6, 5}, random_bytes(300, 3));
  // Cut in the magic, in the dimensions, just after the header, and in the data.
  for (std::size_t keep :
       {std::size_t{2}, std::size_t{9}, std::size_t{16}, std::size_t{17}, std::size_t{200}, full.size() - 1}) {
    for (bool gz : {false, true}) {
      const std::string path = dir.file("cut" + std::to_string(keep) + (gz ? ".gz" : ""));
      const Bytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(keep));
      if (gz)
        write_gz(path, cut);
      else
        write_raw(path, cut);
      const std::string msg = invalid_argument_message([&] { read_idx_images(path); });
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
      if (keep >= 16) {
        EXPECT_NE(msg.find("needs " + std::to_string(full.size())), std::string::npos) << msg;
        EXPECT_NE(msg.find("has " + std::to_string(keep)), std::string::npos) << msg;
      }
    }
  }
}

TEST(Idx, GzipStreamCutShortIsTruncated) {
  // The gzip file itself cut in half (a download stopped midway), not a short IDX gzip'ed.
  TempDir dir;
  write_gz(dir.file("whole.gz"), idx_bytes(0x08, {50, 28, 28}, random_bytes(50 * 784, 4)));
  Bytes gz = read_file(dir.file("whole.gz"));
  gz.resize(gz.size() / 2);
  write_raw(dir.file("half.gz"), gz);
  const std::string msg = invalid_argument_message([&] { read_idx_images(dir.file("half.gz")); });
  EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("corrupt") != std::string::npos) << msg;
}

TEST(Idx, TrailingBytesAreRefused) {
  TempDir dir;
  Bytes b = idx_bytes(0x08, {4, 2, 2}, random_bytes(16, 8));
  b.push_back(7);
  write_raw(dir.file("long"), b);
  EXPECT_NE(invalid_argument_message([&] { read_idx(dir.file("long")); }).find("trailing bytes"), std::string::npos);
  write_gz(dir.file("long.gz"), b);
  EXPECT_NE(invalid_argument_message([&] { read_idx(dir.file("long.gz")); }).find("trailing bytes"), std::string::npos);
}

TEST(Idx, BadMagicNumbersAreRefused) {
  TempDir dir;
  const Bytes data = random_bytes(12, 9);
  struct Case {
    Bytes header;
    const char* why;
  };
  const std::vector<Case> cases = {
      {{1, 0, 8, 1}, "first byte not zero"},  {{0, 7, 8, 1}, "second byte not zero"},
      {{0, 0, 0x0A, 1}, "unknown type code"}, {{0, 0, 8, 0}, "zero dimensions"},
      {{0, 0, 8, 9}, "nine dimensions"},      {{0x1F, 0x8B, 8, 0}, "a gzip magic inside a plain file"},
  };
  for (const Case& c : cases) {
    Bytes b = c.header;
    for (int i = 0; i < 4; ++i) b.push_back(i == 3 ? 12 : 0);
    b.insert(b.end(), data.begin(), data.end());
    const std::string path = dir.file("bad");
    write_raw(path, b);
    const std::string msg = invalid_argument_message([&] { read_idx(path); });
    EXPECT_TRUE(msg.find("not an IDX file") != std::string::npos || msg.find("corrupt") != std::string::npos ||
                msg.find("truncated") != std::string::npos)
        << c.why << ": " << msg;
  }
  // A zero-sized inner dimension.
  write_raw(dir.file("zero"), idx_bytes(0x08, {3, 0, 4}, {}));
  EXPECT_NE(invalid_argument_message([&] { read_idx(dir.file("zero")); }).find("zero-sized"), std::string::npos);
  // An absurd size: refused from the header, before any allocation.
  write_raw(dir.file("huge"), idx_bytes(0x0E, {0xFFFFFFFFu, 0xFFFFFFFFu}, {}));
  EXPECT_NE(invalid_argument_message([&] { read_idx(dir.file("huge")); }).find("implausible"), std::string::npos);
}

// Headers that claim far more than the file holds (10 GB and 1 GB in files of a few MB):
// refused with the file's name and "truncated", having allocated about what the file holds.
struct HugeClaims {
  std::string plain_10g, gz_10g, gz_1g_short, gz_1g_lying;
};
HugeClaims write_huge_claims(const TempDir& dir) {
  HugeClaims c{dir.file("plain-10g"), dir.file("10g.gz"), dir.file("1g-short.gz"), dir.file("1g-lying.gz")};
  const std::vector<std::uint32_t> ten_gb = {10000, 1000, 1000}, one_gb = {1000, 1000, 1000};
  write_raw(c.plain_10g, idx_bytes(0x08, ten_gb, random_bytes(100, 1)));
  write_gz(c.gz_10g, idx_bytes(0x08, ten_gb, random_bytes(100, 1)));
  // 2 MB of random bytes gzip to about 2 MB, which could inflate to 1 GB: the reader must
  // find out by reading, without allocating the gigabyte first.
  const Bytes short_data = idx_bytes(0x08, one_gb, random_bytes(std::size_t{2} << 20, 2));
  write_gz(c.gz_1g_short, short_data);
  // The same with the trailer's ISIZE forged to agree with the header: the reader believes
  // it and allocates 1 GB at once (what an honest 1 GB file gets).
  Bytes forged = read_file(c.gz_1g_short);
  const std::uint32_t claimed = static_cast<std::uint32_t>(16 + 1000ull * 1000 * 1000);
  for (int i = 0; i < 4; ++i) forged[forged.size() - 4 + i] = static_cast<std::uint8_t>(claimed >> (8 * i));
  write_raw(c.gz_1g_lying, forged);
  return c;
}

TEST(Idx, AClaimBeyondWhatTheFileCanHoldIsRefusedBeforeAllocating) {
  TempDir dir;
  const HugeClaims c = write_huge_claims(dir);
  std::string msg = invalid_argument_message([&] { read_idx(c.plain_10g); });
  EXPECT_NE(msg.find("'" + c.plain_10g +
                     "' is truncated: its header [10000, 1000, 1000] needs 10000000016 bytes "
                     "(uncompressed), it has 116"),
            std::string::npos)
      << msg;
  msg = invalid_argument_message([&] { read_idx(c.gz_10g); });
  EXPECT_NE(msg.find("'" + c.gz_10g + "' is truncated or its header damaged"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs 10000000016 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1032-fold"), std::string::npos) << msg;
  msg = invalid_argument_message([&] { read_idx(c.gz_1g_short); });
  EXPECT_NE(msg.find("'" + c.gz_1g_short +
                     "' is truncated: its header [1000, 1000, 1000] needs 1000000016 bytes "
                     "(uncompressed), it has " +
                     std::to_string(16 + (2 << 20))),
            std::string::npos)
      << msg;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// Reads `path` in a child process whose address space may grow by only `headroom` bytes, as
// under a container's or a batch system's memory limit. Returns the child's outcome: "tutti:
// <message>" for a tutti error, "bad_alloc" or "other: <what>" for other exceptions, "ok".
std::string read_under_memory_limit(const std::string& path, std::size_t headroom) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  const pid_t child = fork();
  if (child < 0) return "fork failed";
  if (child == 0) {
    close(fds[0]);
    std::string result;
    std::ifstream statm("/proc/self/statm");
    std::size_t pages = 0;
    statm >> pages;
    const std::size_t used = pages * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    struct rlimit limit {};
    limit.rlim_cur = limit.rlim_max = used + headroom;
    if (pages == 0 || setrlimit(RLIMIT_AS, &limit) != 0) {
      result = "could not set the limit";
    } else {
      try {
        read_idx(path);
        result = "ok";
      } catch (const Error& e) {
        result = std::string("tutti: ") + e.what();
      } catch (const std::bad_alloc&) {
        result = "bad_alloc";
      } catch (const std::exception& e) {
        result = std::string("other: ") + e.what();
      }
    }
    const ssize_t w = write(fds[1], result.data(), result.size());
    _exit(w == static_cast<ssize_t>(result.size()) ? 0 : 1);  // never return into the test runner
  }
  close(fds[1]);
  std::string result;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) result.append(buf, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) result += " (the child ended abnormally)";
  return result;
}

TEST(Idx, UnderAMemoryLimitTheErrorNamesTheFile) {
  if (kAddressSanitizer) GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: no RLIMIT_AS";
  TempDir dir;
  const HugeClaims c = write_huge_claims(dir);
  constexpr std::size_t kHeadroom = std::size_t{256} << 20;  // far less than 1 GB
  for (const std::string& path : {c.plain_10g, c.gz_10g, c.gz_1g_short}) {
    const std::string result = read_under_memory_limit(path, kHeadroom);
    EXPECT_EQ(result.rfind("tutti: ", 0), 0u) << path << ": " << result;
    EXPECT_NE(result.find("'" + path + "' is truncated"), std::string::npos) << result;
  }
  // An allocation that fails for want of memory is an error naming the file, not bad_alloc.
  const std::string result = read_under_memory_limit(c.gz_1g_lying, kHeadroom);
  EXPECT_EQ(result.rfind("tutti: ", 0), 0u) << result;
  EXPECT_NE(result.find("out of host memory reading IDX file '" + c.gz_1g_lying + "'"), std::string::npos) << result;
  EXPECT_NE(result.find("claims 1000000000 bytes"), std::string::npos) << result;
}

TEST(Idx, CorruptGzipDataIsRefused) {
  TempDir dir;
  write_gz(dir.file("good.gz"), idx_bytes(0x08, {20, 28, 28}, random_bytes(20 * 784, 10)));
  const Bytes good = read_file(dir.file("good.gz"));
  ASSERT_GT(good.size(), 100u);
  // Flip bytes in the deflate stream and in the gzip trailer's crc; each must be refused.
  int refused = 0;
  const std::vector<std::size_t> positions = {good.size() / 3, good.size() / 2, good.size() - 6};
  for (std::size_t pos : positions) {
    Bytes bad = good;
    bad[pos] ^= 0x5A;
    write_raw(dir.file("bad.gz"), bad);
    const std::string msg = invalid_argument_message([&] { read_idx(dir.file("bad.gz")); });
    EXPECT_NE(msg.find(dir.file("bad.gz")), std::string::npos) << msg;
    refused += msg.empty() ? 0 : 1;
  }
  EXPECT_EQ(refused, static_cast<int>(positions.size()));
}

// ---- load_fashion_mnist on a small copy in the real files' format --------------------------

void write_split(const TempDir& dir, const std::string& prefix, std::uint32_t n, bool gz, std::uint32_t seed,
                 std::uint8_t bad_label = 0, std::uint32_t label_count = 0) {
  Bytes labels = random_bytes(label_count ? label_count : n, seed + 1);
  for (auto& l : labels) l %= 10;
  if (bad_label) labels.back() = bad_label;
  const Bytes images = idx_bytes(0x08, {n, 28, 28}, random_bytes(std::size_t{n} * 784, seed));
  const Bytes label_file = idx_bytes(0x08, {static_cast<std::uint32_t>(labels.size())}, labels);
  if (gz) {
    write_gz(dir.file(prefix + "-images-idx3-ubyte.gz"), images);
    write_gz(dir.file(prefix + "-labels-idx1-ubyte.gz"), label_file);
  } else {
    write_raw(dir.file(prefix + "-images-idx3-ubyte"), images);
    write_raw(dir.file(prefix + "-labels-idx1-ubyte"), label_file);
  }
}

TEST(FashionMnist, LoadsASmallCopyFlatOrAsImages) {
  TempDir dir;
  write_split(dir, "train", 13, /*gz=*/true, 1);
  write_split(dir, "t10k", 5, /*gz=*/false, 2);  // plain files are found too
  const FashionMnist flat = load_fashion_mnist(dir.str());
  EXPECT_EQ(flat.train.images.shape(), (Shape{13, 784}));
  EXPECT_EQ(flat.train.labels.shape(), (Shape{13}));
  EXPECT_EQ(flat.test.images.shape(), (Shape{5, 784}));
  const Tensor reference = read_idx_images(dir.file("train-images-idx3-ubyte.gz"));
  EXPECT_EQ(flat.train.images.to_floats(), reference.to_floats());
  EXPECT_EQ(flat.test.labels.to_ints(), read_idx_labels(dir.file("t10k-labels-idx1-ubyte")).to_ints());

  const FashionMnist nchw = load_fashion_mnist(dir.str(), {.flatten = false});
  EXPECT_EQ(nchw.train.images.shape(), (Shape{13, 1, 28, 28}));
  EXPECT_EQ(nchw.train.images.to_floats(), reference.to_floats());

  const FashionMnist standardized = load_fashion_mnist(dir.str(), {.standardize = true});
  const auto raw = reference.to_floats();
  const auto st = standardized.train.images.to_floats();
  for (std::size_t i = 0; i < raw.size(); ++i) {
    ASSERT_FLOAT_EQ(st[i], (raw[i] - kFashionMnistMean) / kFashionMnistStd) << i;
  }
}

TEST(FashionMnist, ReadsOnlyTheSamplesAsked) {
  TempDir dir;
  write_split(dir, "train", 13, /*gz=*/true, 1);
  write_split(dir, "t10k", 5, /*gz=*/false, 2);
  const FashionMnist all = load_fashion_mnist(dir.str(), {.standardize = true});
  const FashionMnist some = load_fashion_mnist(dir.str(), {.standardize = true, .train_samples = 4, .test_samples = 3});
  ASSERT_EQ(some.train.images.shape(), (Shape{4, 784}));
  ASSERT_EQ(some.test.images.shape(), (Shape{3, 784}));
  auto first = [](const std::vector<float>& v, std::size_t n) { return std::vector<float>(v.begin(), v.begin() + n); };
  EXPECT_EQ(some.train.images.to_floats(), first(all.train.images.to_floats(), 4 * 784));
  EXPECT_EQ(some.test.images.to_floats(), first(all.test.images.to_floats(), 3 * 784));
  const auto labels = all.train.labels.to_ints();
  EXPECT_EQ(some.train.labels.to_ints(), std::vector<std::int64_t>(labels.begin(), labels.begin() + 4));
  // More than the file holds: all of it.
  EXPECT_EQ(load_fashion_mnist(dir.str(), {.train_samples = 100}).train.images.shape(), (Shape{13, 784}));
  EXPECT_NE(invalid_argument_message([&] {
              load_fashion_mnist(dir.str(), {.train_samples = -1});
            }).find("train_samples and test_samples must be >= 0"),
            std::string::npos);
}

TEST(FashionMnist, ASubsetIsCheckedAndTheRestIsNotRead) {
  // An image file that claims 13 images and holds 6, and labels whose last (the 13th) is 10.
  const Bytes images = idx_bytes(0x08, {13, 28, 28}, random_bytes(std::size_t{6} * 784, 3));
  for (bool gz : {true, false}) {
    TempDir dir;
    write_split(dir, "t10k", 5, /*gz=*/false, 2);
    write_split(dir, "train", 13, /*gz=*/false, 4, /*bad_label=*/10);
    std::filesystem::remove(dir.file("train-images-idx3-ubyte"));
    if (gz) {
      write_gz(dir.file("train-images-idx3-ubyte.gz"), images);
    } else {
      write_raw(dir.file("train-images-idx3-ubyte"), images);
    }
    EXPECT_EQ(load_fashion_mnist(dir.str(), {.train_samples = 6}).train.images.shape(), (Shape{6, 784})) << gz;
    const std::string seventh = invalid_argument_message([&] { load_fashion_mnist(dir.str(), {.train_samples = 7}); });
    EXPECT_NE(seventh.find("is truncated: its first 7 entries need 5504 bytes (uncompressed), it has 4720"),
              std::string::npos)
        << gz << ": " << seventh;
    EXPECT_NE(invalid_argument_message([&] { load_fashion_mnist(dir.str()); }).find("truncated"), std::string::npos)
        << gz;
  }
}

std::string hint_fragment() { return "apt-get install dataset-fashion-mnist"; }

TEST(FashionMnist, MissingDirectoryOrFileSaysHowToGetTheData) {
  TempDir dir;
  std::string msg = invalid_argument_message([&] { load_fashion_mnist(dir.file("nowhere")); });
  EXPECT_NE(msg.find(dir.file("nowhere")), std::string::npos) << msg;
  EXPECT_NE(msg.find(hint_fragment()), std::string::npos) << msg;
  EXPECT_NE(msg.find("scripts/setup.sh"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--data"), std::string::npos) << msg;

  write_split(dir, "train", 4, true, 3);  // no test split
  msg = invalid_argument_message([&] { load_fashion_mnist(dir.str()); });
  EXPECT_NE(msg.find("t10k-images-idx3-ubyte.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find(hint_fragment()), std::string::npos) << msg;
}

TEST(FashionMnist, BadContentsAreRefusedWithTheHint) {
  {
    TempDir dir;  // a label outside [0, 10)
    write_split(dir, "train", 6, true, 4, /*bad_label=*/10);
    write_split(dir, "t10k", 3, true, 5);
    const std::string msg = invalid_argument_message([&] { load_fashion_mnist(dir.str()); });
    EXPECT_NE(msg.find("outside the 10 classes"), std::string::npos) << msg;
    EXPECT_NE(msg.find(hint_fragment()), std::string::npos) << msg;
  }
  {
    TempDir dir;  // 6 images, 7 labels
    write_split(dir, "train", 6, true, 4, 0, /*label_count=*/7);
    write_split(dir, "t10k", 3, true, 5);
    const std::string msg = invalid_argument_message([&] { load_fashion_mnist(dir.str()); });
    EXPECT_NE(msg.find("6 images"), std::string::npos) << msg;
    EXPECT_NE(msg.find("7 labels"), std::string::npos) << msg;
  }
  {
    TempDir dir;  // images that are not 28 x 28
    write_gz(dir.file("train-images-idx3-ubyte.gz"), idx_bytes(0x08, {2, 27, 28}, random_bytes(2 * 27 * 28, 1)));
    write_gz(dir.file("train-labels-idx1-ubyte.gz"), idx_bytes(0x08, {2}, {1, 2}));
    const std::string msg = invalid_argument_message([&] { load_fashion_mnist(dir.str()); });
    EXPECT_NE(msg.find("not [N, 28, 28]"), std::string::npos) << msg;
  }
}

TEST(FashionMnistDir, EnvironmentMovesTheDefault) {
  const char* before = std::getenv(kFashionMnistDirEnv);
  const std::string saved = before != nullptr ? before : "";
  ::unsetenv(kFashionMnistDirEnv);
  EXPECT_EQ(fashion_mnist_dir(), kFashionMnistDefaultDir);
  ::setenv(kFashionMnistDirEnv, "", 1);  // empty: as if unset
  EXPECT_EQ(fashion_mnist_dir(), kFashionMnistDefaultDir);
  ::setenv(kFashionMnistDirEnv, "/data/fmnist", 1);
  EXPECT_EQ(fashion_mnist_dir(), "/data/fmnist");
  // The loader's default follows it: the error names the moved directory.
  const std::string msg = invalid_argument_message([] { load_fashion_mnist(); });
  EXPECT_NE(msg.find("/data/fmnist"), std::string::npos) << msg;
  if (before != nullptr)
    ::setenv(kFashionMnistDirEnv, saved.c_str(), 1);
  else
    ::unsetenv(kFashionMnistDirEnv);
}

// ---- the real files, when Debian's dataset-fashion-mnist package is installed ---------------

TEST(FashionMnist, RealFilesFromDebiansPackage) {
  if (!fs::exists(fs::path(fashion_mnist_dir()) / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed in " << fashion_mnist_dir()
                 << " (apt-get install dataset-fashion-mnist)";
  }
  const FashionMnist d = load_fashion_mnist();
  EXPECT_EQ(d.train.images.shape(), (Shape{60000, 784}));
  EXPECT_EQ(d.train.labels.shape(), (Shape{60000}));
  EXPECT_EQ(d.test.images.shape(), (Shape{10000, 784}));
  EXPECT_EQ(d.test.labels.shape(), (Shape{10000}));
  // Fashion-MNIST is balanced: 6000 training and 1000 test images per class.
  for (const auto& [split, per_class] : {std::pair{&d.train, 6000}, std::pair{&d.test, 1000}}) {
    std::vector<int> counts(10, 0);
    for (std::int64_t l : split->labels.to_ints()) {
      ASSERT_TRUE(l >= 0 && l < 10) << l;
      ++counts[static_cast<std::size_t>(l)];
    }
    for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[c], per_class) << "class " << c;
  }
  // Pixels in [0, 1], and the documented training-set statistics hold.
  const float* x = d.train.images.data_as<float>();
  double sum = 0, sum_sq = 0;
  float lo = 1, hi = 0;
  for (std::int64_t i = 0; i < d.train.images.numel(); ++i) {
    sum += x[i];
    sum_sq += double(x[i]) * x[i];
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const double n = static_cast<double>(d.train.images.numel());
  const double mean = sum / n;
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
  EXPECT_NEAR(mean, kFashionMnistMean, 1e-5);
  EXPECT_NEAR(std::sqrt(sum_sq / n - mean * mean), kFashionMnistStd, 1e-5);
  // The first test image, decoded here straight through zlib (bytes 16.. of the file).
  gzFile f = gzopen((fs::path(fashion_mnist_dir()) / "t10k-images-idx3-ubyte.gz").c_str(), "rb");
  ASSERT_NE(f, nullptr);
  unsigned char buf[16 + 784];
  ASSERT_EQ(gzread(f, buf, sizeof buf), static_cast<int>(sizeof buf));
  gzclose(f);
  const float* first = d.test.images.data_as<float>();
  for (int i = 0; i < 784; ++i) ASSERT_EQ(first[i], buf[16 + i] / 255.0f) << "pixel " << i;
}

}  // namespace
}  // namespace tutti::data
