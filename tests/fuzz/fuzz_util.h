// What tutti's fuzz targets share: a scratch folder in memory (/dev/shm when there is one) where
// each execution writes its input as a file, so that the readers run as users call them (on a
// path: open, fstat, read or pread, gzopen), not on a copy of their parsing code.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace tutti::fuzz {

// The folder this process writes its inputs to, created at first use and removed at exit.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base = std::filesystem::is_directory("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                                           : std::filesystem::temp_directory_path();
    std::filesystem::path d = base / ("tutti-fuzz-" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    std::atexit([] { std::filesystem::remove_all(scratch_dir()); });
    return d;
  }();
  return dir;
}

// Writes `bytes` to `path` (replacing it); aborts on failure, which is the harness's, not tutti's.
inline void write_bytes(const std::string& path, const void* bytes, std::size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) std::abort();
  const auto* p = static_cast<const unsigned char*>(bytes);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) std::abort();
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  ::close(fd);
}

// The input as one file in the scratch folder: its path.
inline std::string input_file(const std::uint8_t* data, std::size_t size, const char* name) {
  const std::string path = (scratch_dir() / name).string();
  write_bytes(path, data, size);
  return path;
}

// How the folder target's input holds several files (the index, then the shards), and how the
// seeds join them.
inline constexpr std::string_view kFileSeparator = "\n--next file--\n";

// The parts of `data` between occurrences of `separator` (the folder target's several files in
// one input).
inline std::vector<std::string_view> split(std::string_view data, std::string_view separator) {
  std::vector<std::string_view> parts;
  for (std::size_t at = 0;;) {
    const std::size_t next = data.find(separator, at);
    if (next == std::string_view::npos) {
      parts.push_back(data.substr(at));
      return parts;
    }
    parts.push_back(data.substr(at, next - at));
    at = next + separator.size();
  }
}

}  // namespace tutti::fuzz
