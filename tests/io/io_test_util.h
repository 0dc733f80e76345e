// What the io tests share: a scratch folder removed afterwards, a file's bytes, tensors of random
// bit patterns and their bit-exact comparison.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tutti/core/tensor.h"

namespace tutti::testing {

using Bytes = std::vector<unsigned char>;

// A fresh folder under the system's temporary directory, named `prefix`_<pid>_<counter>.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "tutti_io_test") {
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // The names in the folder, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

inline Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A tensor of random bit patterns (NaN payloads, infinities, denormals and all).
inline Tensor random_bits(Shape shape, DType dtype, std::uint32_t seed) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  std::mt19937 rng(seed);
  auto* p = static_cast<unsigned char*>(t.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(rng());
  return t;
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace tutti::testing
