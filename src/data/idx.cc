#include "tutti/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <optional>

namespace tutti::data {
namespace {

constexpr const char* kFashionMnistHint =
    ". Fashion-MNIST comes from Debian's package: `apt-get install dataset-fashion-mnist` "
    "(scripts/setup.sh installs it), which puts it in /usr/share/datasets/fashion-mnist; "
    "for a copy elsewhere, pass its directory (--data DIR) or set TUTTI_FASHION_MNIST_DIR";

std::size_t element_size(IdxType type) {
  switch (type) {
    case IdxType::u8:
    case IdxType::i8: return 1;
    case IdxType::i16: return 2;
    case IdxType::i32:
    case IdxType::f32: return 4;
    case IdxType::f64: return 8;
  }
  return 0;
}

bool known_type(std::uint8_t code) {
  return code == 0x08 || code == 0x09 || code == 0x0B || code == 0x0C || code == 0x0D || code == 0x0E;
}

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads up to n bytes; returns how many it got (fewer only at the end of the data). Throws on
// corrupt gzip data or an I/O error.
std::size_t gz_read_fully(gzFile file, void* out, std::size_t n, const std::string& path, const std::string& hint) {
  std::size_t got = 0;
  auto* dst = static_cast<unsigned char*>(out);
  while (got < n) {
    // gzread takes an unsigned and returns an int: read in pieces of at most 1 GiB.
    const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, std::size_t{1} << 30));
    const int r = gzread(file, dst + got, chunk);
    if (r < 0) {
      int code = 0;
      const char* what = gzerror(file, &code);
      if (code == Z_ERRNO) {
        TUTTI_THROW(BackendError, "reading IDX file '", path, "' failed: ", std::strerror(errno), hint);
      }
      TUTTI_THROW(InvalidArgument, "IDX file '", path, "' is corrupt: zlib says \"", what, "\"", hint);
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  // A gzip stream cut short decodes what it can and then reports "unexpected end of file":
  // the data is truncated, which the caller reports with the byte counts.
  return got;
}

std::string dims_str(const std::vector<std::int64_t>& dims) { return shape_str(dims); }

// Deflate's largest expansion: a 258-byte match coded in about 2 bits, 1032:1 (zlib's
// technical details); gzip headers only lower it.
constexpr std::uintmax_t kMaxDeflateRatio = 1032;

// The ISIZE field of a gzip file's trailer (its last 4 bytes, little-endian): the size mod
// 2^32 of the last member's uncompressed data. Empty when unreadable.
std::optional<std::uint32_t> gzip_isize(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  unsigned char b[4];
  if (!f.seekg(-4, std::ios::end) || !f.read(reinterpret_cast<char*>(b), 4)) return std::nullopt;
  return std::uint32_t{b[0]} | std::uint32_t{b[1]} << 8 | std::uint32_t{b[2]} << 16 | std::uint32_t{b[3]} << 24;
}

std::string hex(std::uint32_t v, int digits) {
  static const char* kDigits = "0123456789abcdef";
  std::string s = "0x";
  for (int i = digits - 1; i >= 0; --i) s += kDigits[(v >> (4 * i)) & 0xF];
  return s;
}

// max_items >= 0: only the first max_items entries of the first dimension (all when the file
// has fewer) are read and checked; the rest of the file is not inflated.
IdxArray read_idx_impl(const std::string& path, const std::string& hint, std::int64_t max_items = -1) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) {
    TUTTI_THROW(InvalidArgument, "IDX file '", path, "' does not exist", hint);
  }
  TUTTI_CHECK_ARG(!std::filesystem::is_directory(status), "IDX file '", path, "' is a directory", hint);
  GzFile file(gzopen(path.c_str(), "rb"));
  if (!file) {
    TUTTI_THROW(InvalidArgument, "cannot open IDX file '", path, "': ", errno ? std::strerror(errno) : "out of memory",
                hint);
  }
  gzbuffer(file.get(), 256 * 1024);

  unsigned char magic[4];
  const std::size_t got_magic = gz_read_fully(file.get(), magic, 4, path, hint);
  TUTTI_CHECK_ARG(got_magic == 4, "IDX file '", path, "' is truncated: ", got_magic,
                  " bytes, shorter than the 4-byte magic number", hint);
  TUTTI_CHECK_ARG(magic[0] == 0 && magic[1] == 0 && known_type(magic[2]) && magic[3] >= 1 && magic[3] <= 8, "'", path,
                  "' is not an IDX file: magic number ",
                  hex(std::uint32_t{magic[0]} << 24 | std::uint32_t{magic[1]} << 16 | std::uint32_t{magic[2]} << 8 |
                          std::uint32_t{magic[3]},
                      8),
                  " (expected 0x0000TTKK: type TT in 08,09,0B,0C,0D,0E and 1..8 dimensions KK)", hint);
  IdxArray out;
  out.type = static_cast<IdxType>(magic[2]);
  const int ndim = magic[3];

  std::vector<unsigned char> raw_dims(4 * static_cast<std::size_t>(ndim));
  const std::size_t got_dims = gz_read_fully(file.get(), raw_dims.data(), raw_dims.size(), path, hint);
  TUTTI_CHECK_ARG(got_dims == raw_dims.size(), "IDX file '", path, "' is truncated in its header: ", 4 + got_dims,
                  " of ", 4 + raw_dims.size(), " header bytes", hint);
  std::int64_t count = 1;
  constexpr std::int64_t kMaxBytes = std::int64_t{1} << 40;  // a corrupt header, not a data set
  for (int i = 0; i < ndim; ++i) {
    const std::int64_t d = (std::int64_t{raw_dims[4 * i]} << 24) | (std::int64_t{raw_dims[4 * i + 1]} << 16) |
                           (std::int64_t{raw_dims[4 * i + 2]} << 8) | std::int64_t{raw_dims[4 * i + 3]};
    out.dims.push_back(d);
    // Checked before multiplying, so that a damaged header cannot overflow the count.
    const std::int64_t max_count = kMaxBytes / static_cast<std::int64_t>(element_size(out.type));
    TUTTI_CHECK_ARG(d == 0 || count <= max_count / d, "IDX file '", path, "' has an implausible header: dimensions ",
                    dims_str(out.dims), "... exceed 1 TiB", hint);
    count *= d;
  }
  for (int i = 1; i < ndim; ++i) {
    TUTTI_CHECK_ARG(out.dims[i] > 0, "IDX file '", path, "' has a zero-sized dimension ", i, " in ", dims_str(out.dims),
                    hint);
  }

  const std::size_t header_bytes = 4 + raw_dims.size();
  const std::size_t data_bytes = static_cast<std::size_t>(count) * element_size(out.type);
  // What is read: all of it, or the first max_items entries.
  const bool limited = max_items >= 0 && max_items < out.dims[0];
  const std::int64_t read_count = limited ? count / out.dims[0] * max_items : count;
  const std::size_t read_bytes = static_cast<std::size_t>(read_count) * element_size(out.type);

  // The claim against what the file can hold, before anything is allocated: a damaged or
  // hostile header must not cost gigabytes of zero-filled memory (or a bare bad_alloc) before
  // "truncated". A plain file holds exactly its size; a gzip stream's size is only known once
  // inflated, but deflate expands at most 1032-fold, and the gzip trailer's ISIZE (the size
  // mod 2^32 of the last member) says whether a one-member file agrees with the header.
  std::error_code size_error;
  const std::uintmax_t file_bytes = std::filesystem::file_size(path, size_error);
  const bool compressed = gzdirect(file.get()) == 0;
  bool size_confirmed = false;
  if (!size_error && !compressed) {
    if (limited) {
      TUTTI_CHECK_ARG(header_bytes + read_bytes <= file_bytes, "IDX file '", path, "' is truncated: its first ",
                      max_items, " entries need ", header_bytes + read_bytes, " bytes (uncompressed), it has ",
                      file_bytes, hint);
    } else {
      TUTTI_CHECK_ARG(header_bytes + data_bytes <= file_bytes, "IDX file '", path, "' is truncated: its header ",
                      dims_str(out.dims), " needs ", header_bytes + data_bytes, " bytes (uncompressed), it has ",
                      file_bytes, hint);
    }
    size_confirmed = true;
  } else if (!size_error) {
    TUTTI_CHECK_ARG((header_bytes + data_bytes) / kMaxDeflateRatio <= file_bytes, "IDX file '", path,
                    "' is truncated or its header damaged: the header ", dims_str(out.dims), " needs ",
                    header_bytes + data_bytes, " bytes (uncompressed), more than its ", file_bytes,
                    " bytes of gzip can hold (deflate expands at most ", kMaxDeflateRatio, "-fold)", hint);
    const std::optional<std::uint32_t> isize = gzip_isize(path);
    size_confirmed = isize && *isize == static_cast<std::uint32_t>(header_bytes + data_bytes);
  }
  const std::vector<std::int64_t> file_dims = out.dims;  // for the messages
  if (limited) out.dims[0] = max_items;
  // Confirmed sizes are allocated at once; others grow with the data actually read (at most
  // twice what the file holds).
  constexpr std::size_t kFirstChunk = std::size_t{16} << 20;
  std::size_t got = 0;
  try {
    out.bytes.resize(size_confirmed ? read_bytes : std::min(read_bytes, kFirstChunk));
    while (got < read_bytes) {
      if (got == out.bytes.size()) out.bytes.resize(std::min(read_bytes, 2 * out.bytes.size()));
      const std::size_t want = out.bytes.size() - got;
      const std::size_t n = gz_read_fully(file.get(), out.bytes.data() + got, want, path, hint);
      got += n;
      if (n < want) break;  // the end of the data
    }
  } catch (const std::bad_alloc&) {
    TUTTI_THROW(BackendError, "out of host memory reading IDX file '", path, "': its header ", dims_str(file_dims),
                " claims ", data_bytes, " bytes of data (", got, " read so far)", hint);
  }
  if (limited) {
    TUTTI_CHECK_ARG(got == read_bytes, "IDX file '", path, "' is truncated: its first ", max_items, " entries need ",
                    header_bytes + read_bytes, " bytes (uncompressed), it has ", header_bytes + got, hint);
    return out;  // the rest is neither read nor checked
  }
  TUTTI_CHECK_ARG(got == data_bytes, "IDX file '", path, "' is truncated: its header ", dims_str(out.dims), " needs ",
                  header_bytes + data_bytes, " bytes (uncompressed), it has ", header_bytes + got, hint);
  unsigned char extra = 0;
  const std::size_t more = gz_read_fully(file.get(), &extra, 1, path, hint);
  TUTTI_CHECK_ARG(more == 0, "IDX file '", path, "' has trailing bytes after the ", header_bytes + data_bytes,
                  " that its header ", dims_str(out.dims), " describes", hint);
  return out;
}

Tensor images_from(const IdxArray& a, const std::string& path, const std::string& hint) {
  TUTTI_CHECK_ARG(a.type == IdxType::u8 && a.dims.size() >= 2, "IDX file '", path,
                  "' does not hold images: expected unsigned bytes [N, ...] (magic 0x0000080k, k >= 2), got type ",
                  hex(static_cast<std::uint32_t>(a.type), 2), " dimensions ", dims_str(a.dims), hint);
  Tensor t;
  {
    ErrorContext context("converting IDX file '" + path + "' to f32");  // names the file when memory runs out
    t = Tensor::empty(a.dims, DType::f32);
  }
  float* dst = t.data_as<float>();
  // A table, so the result is exactly b / 255.0f (no multiply-by-reciprocal rounding).
  float table[256];
  for (int b = 0; b < 256; ++b) table[b] = static_cast<float>(b) / 255.0f;
  const std::size_t n = a.bytes.size();
  for (std::size_t i = 0; i < n; ++i) dst[i] = table[a.bytes[i]];
  return t;
}

Tensor labels_from(const IdxArray& a, const std::string& path, const std::string& hint) {
  TUTTI_CHECK_ARG(a.type == IdxType::u8 && a.dims.size() == 1, "IDX file '", path,
                  "' does not hold labels: expected unsigned bytes [N] (magic 0x00000801), got type ",
                  hex(static_cast<std::uint32_t>(a.type), 2), " dimensions ", dims_str(a.dims), hint);
  Tensor t;
  {
    ErrorContext context("converting IDX file '" + path + "' to i32");
    t = Tensor::empty(a.dims, DType::i32);
  }
  std::int32_t* dst = t.data_as<std::int32_t>();
  for (std::size_t i = 0; i < a.bytes.size(); ++i) dst[i] = a.bytes[i];
  return t;
}

// "<dir>/<name>.gz" when it exists, else "<dir>/<name>" when that exists, else the .gz path
// (so the error names the file the package installs).
std::string find_file(const std::string& dir, const std::string& name) {
  const std::filesystem::path base(dir);
  const auto gz = base / (name + ".gz");
  if (std::filesystem::exists(gz)) return gz.string();
  const auto plain = base / name;
  if (std::filesystem::exists(plain)) return plain.string();
  return gz.string();
}

Dataset load_split(const std::string& dir, const std::string& prefix, const FashionMnistOptions& options,
                   std::int64_t samples) {
  const std::string image_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string label_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  const std::int64_t max_items = samples > 0 ? samples : -1;
  Dataset d;
  d.images = images_from(read_idx_impl(image_path, kFashionMnistHint, max_items), image_path, kFashionMnistHint);
  d.labels = labels_from(read_idx_impl(label_path, kFashionMnistHint, max_items), label_path, kFashionMnistHint);
  TUTTI_CHECK_ARG(d.images.ndim() == 3 && d.images.dim(1) == 28 && d.images.dim(2) == 28, "'", image_path,
                  "' holds images of shape ", shape_str(d.images.shape()), ", not [N, 28, 28]", kFashionMnistHint);
  TUTTI_CHECK_ARG(d.images.dim(0) == d.labels.dim(0), "'", image_path, "' has ", d.images.dim(0), " images but '",
                  label_path, "' has ", d.labels.dim(0), " labels", kFashionMnistHint);
  const std::int32_t* labels = d.labels.data_as<std::int32_t>();
  for (std::int64_t i = 0; i < d.labels.numel(); ++i) {
    TUTTI_CHECK_ARG(labels[i] >= 0 && labels[i] < 10, "'", label_path, "': label ", i, " is ", labels[i],
                    ", outside the 10 classes [0, 10)", kFashionMnistHint);
  }
  if (options.standardize) {
    float* x = d.images.data_as<float>();
    for (std::int64_t i = 0; i < d.images.numel(); ++i) x[i] = (x[i] - kFashionMnistMean) / kFashionMnistStd;
  }
  const std::int64_t n = d.images.dim(0);
  d.images = options.flatten ? d.images.reshape({n, 28 * 28}) : d.images.reshape({n, 1, 28, 28});
  return d;
}

}  // namespace

std::string fashion_mnist_dir() {
  const char* env = std::getenv(kFashionMnistDirEnv);
  return env != nullptr && env[0] != '\0' ? std::string(env) : std::string(kFashionMnistDefaultDir);
}

IdxArray read_idx(const std::string& path) { return read_idx_impl(path, ""); }

Tensor read_idx_images(const std::string& path) { return images_from(read_idx_impl(path, ""), path, ""); }

Tensor read_idx_labels(const std::string& path) { return labels_from(read_idx_impl(path, ""), path, ""); }

FashionMnist load_fashion_mnist(const std::string& dir, const FashionMnistOptions& options) {
  ErrorContext context("loading Fashion-MNIST from '" + dir + "'");
  TUTTI_CHECK_ARG(std::filesystem::is_directory(dir), "Fashion-MNIST directory '", dir, "' does not exist",
                  kFashionMnistHint);
  FashionMnist out;
  TUTTI_CHECK_ARG(options.train_samples >= 0 && options.test_samples >= 0,
                  "FashionMnistOptions: train_samples and test_samples must be >= 0 (0: all), got ",
                  options.train_samples, " and ", options.test_samples);
  out.train = load_split(dir, "train", options, options.train_samples);
  out.test = load_split(dir, "t10k", options, options.test_samples);
  return out;
}

}  // namespace tutti::data
