#include "io/checkpoint_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tutti/core/stream.h"

namespace tutti::io::detail {

static_assert(std::endian::native == std::endian::little,
              "the checkpoint format stores tensors in little-endian byte order");

std::uint32_t crc_update(std::uint32_t crc, const void* data, std::size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<std::size_t>(n, std::size_t{1} << 30));
    crc = static_cast<std::uint32_t>(crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

std::uint32_t header_crc(const unsigned char* header, std::size_t header_size) {
  std::uint32_t crc = crc_update(0, header, 40);
  return crc_update(crc, header + kFixedHeaderBytes, header_size - kFixedHeaderBytes);
}

void throw_errno(const std::string& call, const std::string& path, int err) {
  TUTTI_THROW(BackendError, call, "('", path, "') failed: ", std::strerror(err));
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

void Fd::close_checked(const std::string& path) {
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_errno("close", path, errno);
}

void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno("write", path, errno);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

std::uint64_t FilePlan::data_bytes() const {
  std::uint64_t n = 0;
  for (std::uint64_t b : nbytes) n += b;
  return n;
}

namespace {

// ---- little-endian encoding of the header ------------------------------------------------

void put_u8(std::vector<unsigned char>& b, std::uint8_t v) { b.push_back(v); }
void put_u16(std::vector<unsigned char>& b, std::uint16_t v) {
  for (int i = 0; i < 2; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_u32(std::vector<unsigned char>& b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_u64(std::vector<unsigned char>& b, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void set_u32(std::vector<unsigned char>& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<unsigned char>(v >> (8 * i));
}
void set_u64(std::vector<unsigned char>& b, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_string(std::vector<unsigned char>& b, const std::string& s, const char* call) {
  TUTTI_CHECK_ARG(s.size() <= 0xFFFFFFFFu, call, ": a name or metadata value of ", s.size(),
                  " bytes is longer than the format's 4 GiB limit");
  put_u32(b, static_cast<std::uint32_t>(s.size()));
  b.insert(b.end(), s.begin(), s.end());
}

// ---- POSIX writing -------------------------------------------------------------------------

constexpr const char* kTmpMarker = ".tmp.";
std::string pid_suffix() { return kTmpMarker + std::to_string(::getpid()); }

// Removes the regular files "<path>.tmp.<digits>": temporaries of saves to `path` that were killed before their
// rename (a kill -9, a node lost, the job's time limit). Failures are ignored: the file stays
// for the next save, and this save does not depend on it.
void remove_stale_temporaries(const std::string& path) {
  const std::filesystem::path target(path);
  std::filesystem::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  const std::string prefix = target.filename().string() + kTmpMarker;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    // Only regular files: a save writes nothing else.
    std::error_code type_error;
    if (!it->is_regular_file(type_error) || it->is_symlink(type_error)) continue;
    if (!std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    std::error_code ignored;
    std::filesystem::remove(it->path(), ignored);
  }
}

}  // namespace

// ---- plan ----------------------------------------------------------------------------------

FilePlan plan_checkpoint(const StateDict& state, const Metadata& metadata, const char* call) {
  for (const auto& [name, t] : state) {
    TUTTI_CHECK_ARG(!name.empty(), call, ": a state dict entry has an empty name");
    TUTTI_CHECK_ARG(t.defined(), call, ": state dict entry '", name, "' is an undefined tensor");
    TUTTI_CHECK_ARG(t.ndim() <= static_cast<int>(kMaxNdim), call, ": entry '", name, "' has ", t.ndim(),
                    " dimensions, at most ", kMaxNdim, " are supported");
  }
  for (const auto& [key, value] : metadata) {
    TUTTI_CHECK_ARG(!key.empty(), call, ": a metadata entry has an empty key");
  }

  // The header, with offsets patched in once its size is known.
  FilePlan plan;
  std::vector<unsigned char>& header = plan.header;
  header.assign(kMagic, kMagic + 8);
  put_u32(header, kCheckpointFormatVersion);
  put_u32(header, static_cast<std::uint32_t>(metadata.size()));
  put_u32(header, static_cast<std::uint32_t>(state.size()));
  put_u32(header, 0);
  put_u64(header, 0);  // header size, patched below
  put_u64(header, 0);  // file size, patched below
  put_u32(header, 0);  // header crc, patched below
  put_u32(header, 0);
  for (const auto& [key, value] : metadata) {
    put_string(header, key, call);
    put_string(header, value, call);
  }
  std::vector<std::size_t> offset_fields;
  for (const auto& [name, t] : state) {
    put_string(header, name, call);
    put_u8(header, static_cast<std::uint8_t>(t.dtype()));
    put_u8(header, static_cast<std::uint8_t>(t.ndim()));
    put_u16(header, 0);
    for (std::int64_t d : t.shape()) put_u64(header, static_cast<std::uint64_t>(d));
    offset_fields.push_back(header.size());
    put_u64(header, 0);  // offset, patched below
    put_u64(header, t.nbytes());
    plan.nbytes.push_back(t.nbytes());
  }
  const std::uint64_t header_size = align_up(header.size());
  header.resize(header_size, 0);
  std::uint64_t at = header_size;
  for (std::size_t i = 0; i < plan.nbytes.size(); ++i) {
    plan.offsets.push_back(at);
    set_u64(header, offset_fields[i], at);
    at = align_up(at + plan.nbytes[i]);
  }
  plan.file_size = at + kTrailerBytes;
  set_u64(header, 24, header_size);
  set_u64(header, 32, plan.file_size);
  set_u32(header, 40, header_crc(header.data(), header.size()));
  return plan;
}

// ---- write ---------------------------------------------------------------------------------

namespace {

// Writes a temporary file with `fill` (which writes to the descriptor), fsyncs it and renames it
// over `path`, then fsyncs the directory. On failure the temporary is removed and `path` left.
template <class Fill>
void write_atomically(const std::string& path, Fill fill) {
  // Killed saves' temporaries go first, so that their space is free for this one.
  remove_stale_temporaries(path);
  const std::string tmp = path + pid_suffix();
  try {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) throw_errno("open", tmp, errno);
    fill(fd.get(), tmp);
    if (::fsync(fd.get()) != 0) throw_errno("fsync", tmp, errno);
    fd.close_checked(tmp);
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw_errno("rename", tmp + "' -> '" + path, errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename is durable once the directory is on disk too.
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) throw_errno("open (directory, to fsync the rename)", dir.string(), errno);
  if (::fsync(dfd.get()) != 0) throw_errno("fsync (directory, after the rename)", dir.string(), errno);
}

// The file's pieces in order, each as (pointer, bytes): header, data and padding, trailer.
template <class Put>
void put_file(const FilePlan& plan, const std::vector<const void*>& data, Put put) {
  TUTTI_CHECK(data.size() == plan.nbytes.size(), "checkpoint file: ", data.size(), " buffers for ", plan.nbytes.size(),
              " entries");
  static const unsigned char kZeros[kAlign] = {};
  std::uint32_t crc = crc_update(0, plan.header.data(), plan.header.size());
  put(plan.header.data(), plan.header.size());
  std::uint64_t written = plan.header.size();
  for (std::size_t i = 0; i < data.size(); ++i) {
    const auto n = static_cast<std::size_t>(plan.nbytes[i]);
    crc = crc_update(crc, data[i], n);
    put(data[i], n);
    written += n;
    const std::uint64_t next = i + 1 < data.size() ? plan.offsets[i + 1] : plan.file_size - kTrailerBytes;
    const std::size_t pad = static_cast<std::size_t>(next - written);
    crc = crc_update(crc, kZeros, pad);
    put(kZeros, pad);
    written = next;
  }
  std::vector<unsigned char> trailer;
  put_u32(trailer, crc);
  put(trailer.data(), trailer.size());
}

}  // namespace

void write_checkpoint_file(const std::string& path, const FilePlan& plan, const std::vector<const void*>& data) {
  write_atomically(path, [&](int fd, const std::string& tmp) {
    put_file(plan, data, [&](const void* p, std::size_t n) { write_all(fd, p, n, tmp); });
  });
}

std::vector<unsigned char> encode_checkpoint(const FilePlan& plan, const std::vector<const void*>& data) {
  std::vector<unsigned char> out;
  out.reserve(static_cast<std::size_t>(plan.file_size));
  put_file(plan, data, [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    if (n > 0) out.insert(out.end(), b, b + n);
  });
  return out;
}

void write_file_atomically(const std::string& path, const void* bytes, std::size_t n) {
  write_atomically(path, [&](int fd, const std::string& tmp) { write_all(fd, bytes, n, tmp); });
}

void write_file_atomically(const std::string& path, const std::function<void(int fd, const std::string& tmp)>& fill) {
  write_atomically(path, fill);
}

HostData host_data(const StateDict& state) {
  HostData out;
  out.tensors.reserve(state.size());
  for (const auto& [name, t] : state) {
    if (t.device().is_cpu()) {
      out.tensors.push_back(t);
    } else {
      Stream stream = Stream::default_for(t.device());
      out.tensors.push_back(t.to(Device::cpu(), stream));
      stream.synchronize();
    }
  }
  out.data.reserve(out.tensors.size());
  for (const Tensor& t : out.tensors) out.data.push_back(t.nbytes() == 0 ? nullptr : t.data());
  return out;
}

}  // namespace tutti::io::detail
