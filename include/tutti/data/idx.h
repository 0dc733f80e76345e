// IDX files (the format of MNIST and Fashion-MNIST), plain or gzip'ed, and the loader of
// Fashion-MNIST from Debian's `dataset-fashion-mnist` package.
//
// An IDX file is a big-endian header, two zero bytes, a type code (0x08 = unsigned byte),
// the number of dimensions k, then k u32 dimensions, followed by the elements in row-major
// order. Files are read through zlib's gzopen/gzread, which reads gzip'ed and plain files
// alike, so "x-ubyte.gz" and "x-ubyte" both work.
//
// Errors: a missing or unreadable path, a bad header (magic, type code, dimensions), a file
// shorter or longer than its header says, or corrupt gzip data throws tutti::InvalidArgument
// naming the path and what is wrong; an I/O error from the operating system, or memory
// running out, throws tutti::BackendError naming the path. Nothing is printed.
//
// The sizes a header claims are checked against what the file can hold before anything is
// allocated: a plain file must be at least as long as its header says; a gzip file can
// inflate at most 1032-fold (deflate's limit), and unless its trailer's ISIZE agrees with
// the header (one gzip member, the usual case) the data buffer grows as data actually
// arrives. So a damaged header claiming gigabytes costs at most about twice the real data,
// and fails with "truncated" naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/core/tensor.h"
#include "tutti/data/dataset.h"

namespace tutti::data {

// The IDX element types (the third byte of the magic number).
enum class IdxType : std::uint8_t { u8 = 0x08, i8 = 0x09, i16 = 0x0B, i32 = 0x0C, f32 = 0x0D, f64 = 0x0E };

// An IDX file as it is stored: type, dimensions, and the element bytes as they appear in the
// file (multi-byte elements stay big-endian, as the format stores them).
struct IdxArray {
  IdxType type = IdxType::u8;
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> bytes;
};

// Reads and validates a whole IDX file (plain or gzip'ed). Checks the magic number's zero
// bytes and type code, that there are 1..8 dimensions, none zero-sized beyond the first,
// and that the data is exactly as long as the dimensions say (not shorter: "truncated",
// not longer: "trailing bytes").
IdxArray read_idx(const std::string& path);

// An unsigned-byte IDX file of k >= 2 dimensions [N, ...] as an f32 CPU tensor of the same
// shape, each byte b mapped to b / 255 (so pixels lie in [0, 1]).
Tensor read_idx_images(const std::string& path);
// An unsigned-byte IDX file of one dimension [N] as an i32 CPU tensor of class indices.
Tensor read_idx_labels(const std::string& path);

// Where Debian's `dataset-fashion-mnist` package puts the files.
inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";
// The environment variable that moves the default (for a copy unpacked elsewhere, e.g. from the
// .deb without installing it).
inline constexpr const char* kFashionMnistDirEnv = "TUTTI_FASHION_MNIST_DIR";
// The directory to read Fashion-MNIST from when none is given: $TUTTI_FASHION_MNIST_DIR when
// set and not empty, else kFashionMnistDefaultDir.
std::string fashion_mnist_dir();

struct FashionMnistOptions {
  // Images as [N, 784] (for an MLP) when true, as [N, 1, 28, 28] (for a CNN) when false;
  // the same storage either way.
  bool flatten = true;
  // Pixels are b / 255 in [0, 1]. With standardize, they are further mapped to
  // (b / 255 - kMean) / kStd with the training set's mean and standard deviation, so the
  // inputs have mean 0 and variance 1 over the training set.
  bool standardize = false;
  // Only the first N samples of the training / test set (0: all; a file with fewer gives all
  // it has). The rest of each file is neither decompressed nor checked: a short run on a
  // subset starts in a fraction of the full load's time.
  std::int64_t train_samples = 0;
  std::int64_t test_samples = 0;
};
// Fashion-MNIST's training-set pixel statistics (of b / 255).
inline constexpr float kFashionMnistMean = 0.2860406f;
inline constexpr float kFashionMnistStd = 0.3530242f;

struct FashionMnist {
  Dataset train;  // 60000 samples in the real data set
  Dataset test;   // 10000 samples
};

// Loads train-{images-idx3,labels-idx1}-ubyte and t10k-{...}-ubyte from `dir`, each with a
// ".gz" suffix or, when that does not exist, without one. Checks that images are 28 x 28,
// that image and label counts agree and that every label is in [0, 10) (the number of
// samples is not checked, so a subset in Fashion-MNIST's format loads too). A missing or bad
// file throws InvalidArgument that names it and says how to get the data (install the
// `dataset-fashion-mnist` package, e.g. with scripts/setup.sh, or point --data at a copy).
// Reads ~30 MB of gzip and takes about a second (per process) for the whole set; with
// train_samples / test_samples, only those samples' part of each file (checks included).
// `dir` defaults to fashion_mnist_dir().
FashionMnist load_fashion_mnist(const std::string& dir = fashion_mnist_dir(), const FashionMnistOptions& options = {});

}  // namespace tutti::data
