#include "tutti/io/checkpoint.h"

#include <optional>

#include "tutti/core/trace.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace tutti::io {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the checkpoint format stores tensors in little-endian byte order");

constexpr char kMagic[8] = {'T', 'U', 'T', 'T', 'I', 'C', 'K', 'P'};
constexpr std::size_t kFixedHeaderBytes = 48;
constexpr std::size_t kAlign = 64;
constexpr std::size_t kTrailerBytes = 4;
constexpr std::uint32_t kMaxNdim = 16;
constexpr int kNumDTypes = 5;  // f32, f16, bf16, i32, i64

std::uint64_t align_up(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string hex32(std::uint32_t v) {
  static const char* kDigits = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 7; i >= 0; --i) s += kDigits[(v >> (4 * i)) & 0xF];
  return s;
}

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
void put_string(std::vector<unsigned char>& b, const std::string& s) {
  TUTTI_CHECK_ARG(s.size() <= 0xFFFFFFFFu, "save_checkpoint: a name or metadata value of ", s.size(),
                  " bytes is longer than the format's 4 GiB limit");
  put_u32(b, static_cast<std::uint32_t>(s.size()));
  b.insert(b.end(), s.begin(), s.end());
}
std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint32_t get_u32_le(const unsigned char* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24;
}

// The header crc covers [0, 40) and [48, H): everything in the header but its own field.
std::uint32_t header_crc(const unsigned char* header, std::size_t header_size) {
  std::uint32_t crc = crc_update(0, header, 40);
  return crc_update(crc, header + kFixedHeaderBytes, header_size - kFixedHeaderBytes);
}

// ---- POSIX file helpers that throw -------------------------------------------------------

[[noreturn]] void throw_errno(const std::string& call, const std::string& path, int err) {
  TUTTI_THROW(BackendError, call, "('", path, "') failed: ", std::strerror(err));
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes and reports the error (close can report a delayed write error).
  void close_checked(const std::string& path) {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_errno("close", path, errno);
  }

 private:
  int fd_;
};

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

// Reads exactly n bytes; `offset` is where the read starts, for the truncation message.
void read_all(int fd, void* data, std::size_t n, const std::string& path, std::uint64_t offset,
              std::uint64_t expected_size) {
  auto* p = static_cast<unsigned char*>(data);
  std::uint64_t at = offset;
  while (n > 0) {
    const ssize_t r = ::read(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno("read", path, errno);
    }
    if (r == 0) {
      TUTTI_THROW(InvalidArgument, "checkpoint '", path, "' is truncated at byte ", at, " of ", expected_size);
    }
    p += r;
    at += static_cast<std::uint64_t>(r);
    n -= static_cast<std::size_t>(r);
  }
}

// Bounds-checked reading of the header's variable part.
class HeaderCursor {
 public:
  HeaderCursor(const std::vector<unsigned char>& b, std::size_t pos, const std::string& path)
      : b_(b), pos_(pos), path_(path) {}
  void need(std::size_t n, const char* what) {
    TUTTI_CHECK_ARG(n <= b_.size() - pos_, "checkpoint '", path_, "' is corrupt: ", what,
                    " runs past the end of the header (", b_.size(), " bytes)");
  }
  std::uint8_t u8(const char* what) {
    need(1, what);
    return b_[pos_++];
  }
  std::uint16_t u16(const char* what) {
    need(2, what);
    const std::uint16_t v = static_cast<std::uint16_t>(b_[pos_] | (b_[pos_ + 1] << 8));
    pos_ += 2;
    return v;
  }
  std::uint32_t u32(const char* what) {
    need(4, what);
    const auto v = get_u64_le(4);
    pos_ += 4;
    return static_cast<std::uint32_t>(v);
  }
  std::uint64_t u64(const char* what) {
    need(8, what);
    const auto v = get_u64_le(8);
    pos_ += 8;
    return v;
  }
  std::string str(const char* what) {
    const std::uint32_t n = u32(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  std::uint64_t get_u64_le(int bytes) const {
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | b_[pos_ + i];
    return v;
  }
  const std::vector<unsigned char>& b_;
  std::size_t pos_;
  const std::string& path_;
};

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  std::uint64_t offset;
  std::uint64_t nbytes;
};

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

// ---- save ----------------------------------------------------------------------------------

void save_checkpoint(const std::string& path, const StateDict& state, const Metadata& metadata) {
  std::optional<trace::Span> span;
  if (trace::on()) span.emplace("checkpoint save", "checkpoint");
  ErrorContext context("saving checkpoint '" + path + "'");
  TUTTI_CHECK_ARG(!path.empty(), "save_checkpoint: empty path");
  // Host copies of everything first, so that a bad entry fails before any file is touched.
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.reserve(state.size());
  for (const auto& [name, t] : state) {
    TUTTI_CHECK_ARG(!name.empty(), "save_checkpoint: a state dict entry has an empty name");
    TUTTI_CHECK_ARG(t.defined(), "save_checkpoint: state dict entry '", name, "' is an undefined tensor");
    TUTTI_CHECK_ARG(t.ndim() <= static_cast<int>(kMaxNdim), "save_checkpoint: entry '", name, "' has ", t.ndim(),
                    " dimensions, at most ", kMaxNdim, " are supported");
    if (t.device().is_cpu()) {
      tensors.emplace_back(name, t);
    } else {
      Stream stream = Stream::default_for(t.device());
      Tensor host = t.to(Device::cpu(), stream);
      stream.synchronize();
      tensors.emplace_back(name, host);
    }
  }
  for (const auto& [key, value] : metadata) {
    TUTTI_CHECK_ARG(!key.empty(), "save_checkpoint: a metadata entry has an empty key");
  }

  // The header, with offsets patched in once its size is known.
  std::vector<unsigned char> header(kMagic, kMagic + 8);
  put_u32(header, kCheckpointFormatVersion);
  put_u32(header, static_cast<std::uint32_t>(metadata.size()));
  put_u32(header, static_cast<std::uint32_t>(tensors.size()));
  put_u32(header, 0);
  put_u64(header, 0);  // header size, patched below
  put_u64(header, 0);  // file size, patched below
  put_u32(header, 0);  // header crc, patched below
  put_u32(header, 0);
  for (const auto& [key, value] : metadata) {
    put_string(header, key);
    put_string(header, value);
  }
  std::vector<std::size_t> offset_fields;
  for (const auto& [name, t] : tensors) {
    put_string(header, name);
    put_u8(header, static_cast<std::uint8_t>(t.dtype()));
    put_u8(header, static_cast<std::uint8_t>(t.ndim()));
    put_u16(header, 0);
    for (std::int64_t d : t.shape()) put_u64(header, static_cast<std::uint64_t>(d));
    offset_fields.push_back(header.size());
    put_u64(header, 0);  // offset, patched below
    put_u64(header, t.nbytes());
  }
  const std::uint64_t header_size = align_up(header.size());
  header.resize(header_size, 0);
  std::uint64_t at = header_size;
  std::vector<std::uint64_t> offsets;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    offsets.push_back(at);
    set_u64(header, offset_fields[i], at);
    at = align_up(at + tensors[i].second.nbytes());
  }
  const std::uint64_t file_size = at + kTrailerBytes;
  set_u64(header, 24, header_size);
  set_u64(header, 32, file_size);
  set_u32(header, 40, header_crc(header.data(), header.size()));

  // Write the temporary file; on any failure remove it and leave `path` untouched. Killed
  // saves' temporaries go first, so that their space is free for this one.
  remove_stale_temporaries(path);
  const std::string tmp = path + pid_suffix();
  try {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) throw_errno("open", tmp, errno);
    std::uint32_t crc = crc_update(0, header.data(), header.size());
    write_all(fd.get(), header.data(), header.size(), tmp);
    static const unsigned char kZeros[kAlign] = {};
    std::uint64_t written = header_size;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i].second;
      crc = crc_update(crc, t.data(), t.nbytes());
      write_all(fd.get(), t.data(), t.nbytes(), tmp);
      written += t.nbytes();
      const std::uint64_t next = i + 1 < tensors.size() ? offsets[i + 1] : file_size - kTrailerBytes;
      const std::size_t pad = static_cast<std::size_t>(next - written);
      crc = crc_update(crc, kZeros, pad);
      write_all(fd.get(), kZeros, pad, tmp);
      written = next;
    }
    std::vector<unsigned char> trailer;
    put_u32(trailer, crc);
    write_all(fd.get(), trailer.data(), trailer.size(), tmp);
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

// ---- load ----------------------------------------------------------------------------------

Checkpoint load_checkpoint(const std::string& path) {
  ErrorContext context("loading checkpoint '" + path + "'");
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) TUTTI_THROW(InvalidArgument, "checkpoint '", path, "' does not exist");
    throw_errno("open", path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno("fstat", path, errno);
  TUTTI_CHECK_ARG(S_ISREG(st.st_mode), "checkpoint '", path, "' is not a regular file");
  const std::uint64_t actual_size = static_cast<std::uint64_t>(st.st_size);

  // Fixed header: magic, version, sizes.
  std::vector<unsigned char> header(kFixedHeaderBytes);
  const std::size_t fixed_available = static_cast<std::size_t>(std::min<std::uint64_t>(actual_size, kFixedHeaderBytes));
  read_all(fd.get(), header.data(), fixed_available, path, 0, actual_size);
  const std::size_t magic_available = std::min<std::size_t>(fixed_available, 8);
  TUTTI_CHECK_ARG(std::memcmp(header.data(), kMagic, magic_available) == 0, "'", path,
                  "' is not a tutti checkpoint (it does not start with \"TUTTICKP\")");
  TUTTI_CHECK_ARG(fixed_available == kFixedHeaderBytes, "checkpoint '", path, "' is truncated at byte ", actual_size,
                  " of at least ", kFixedHeaderBytes, " (the fixed header)");
  const std::uint32_t version = get_u32_le(header.data() + 8);
  TUTTI_CHECK_ARG(version == kCheckpointFormatVersion, "checkpoint '", path, "' has unsupported format version ",
                  version, " (this build of tutti reads version ", kCheckpointFormatVersion, ")");
  const std::uint32_t num_metadata = get_u32_le(header.data() + 12);
  const std::uint32_t num_entries = get_u32_le(header.data() + 16);
  const std::uint64_t header_size = get_u64(header.data() + 24);
  const std::uint64_t file_size = get_u64(header.data() + 32);
  const std::uint32_t stored_header_crc = get_u32_le(header.data() + 40);
  if (header_size > actual_size || header_size < kFixedHeaderBytes) {
    // The header cannot be verified: either the file was cut short or the size is damaged.
    TUTTI_CHECK_ARG(file_size <= actual_size, "checkpoint '", path, "' is truncated at byte ", actual_size, " of ",
                    file_size);
    TUTTI_THROW(InvalidArgument, "checkpoint '", path, "' is corrupt: header size ", header_size,
                " does not fit in the file's ", actual_size, " bytes");
  }
  header.resize(static_cast<std::size_t>(header_size));
  read_all(fd.get(), header.data() + kFixedHeaderBytes, header_size - kFixedHeaderBytes, path, kFixedHeaderBytes,
           actual_size);
  const std::uint32_t computed_header_crc = header_crc(header.data(), header.size());
  TUTTI_CHECK_ARG(stored_header_crc == computed_header_crc, "checkpoint '", path,
                  "' is corrupt: header checksum mismatch: stored ", hex32(stored_header_crc), " != computed ",
                  hex32(computed_header_crc));
  TUTTI_CHECK_ARG(actual_size >= file_size, "checkpoint '", path, "' is truncated at byte ", actual_size, " of ",
                  file_size);
  TUTTI_CHECK_ARG(actual_size == file_size, "checkpoint '", path, "' has ", actual_size - file_size,
                  " trailing bytes after the ", file_size, " its header describes");

  // Metadata and entry table.
  Checkpoint out;
  HeaderCursor cur(header, kFixedHeaderBytes, path);
  for (std::uint32_t i = 0; i < num_metadata; ++i) {
    std::string key = cur.str("a metadata key");
    out.metadata[key] = cur.str("a metadata value");
  }
  std::vector<Entry> entries;
  std::uint64_t data_end = header_size;
  const std::uint64_t data_limit = file_size - kTrailerBytes;
  for (std::uint32_t i = 0; i < num_entries; ++i) {
    Entry e;
    e.name = cur.str("an entry name");
    const std::uint8_t dtype = cur.u8("an entry dtype");
    const std::uint8_t ndim = cur.u8("an entry's dimension count");
    cur.u16("an entry's reserved field");
    TUTTI_CHECK_ARG(dtype < kNumDTypes && ndim <= kMaxNdim, "checkpoint '", path, "' is corrupt: entry '", e.name,
                    "' has dtype code ", int(dtype), " and ", int(ndim), " dimensions");
    e.dtype = static_cast<DType>(dtype);
    std::uint64_t elements = 1;
    for (int d = 0; d < ndim; ++d) {
      const std::uint64_t dim = cur.u64("an entry's shape");
      TUTTI_CHECK_ARG(dim <= data_limit && (dim == 0 || elements <= data_limit / dim), "checkpoint '", path,
                      "' is corrupt: entry '", e.name, "' has an impossible shape");
      elements *= dim;
      e.shape.push_back(static_cast<std::int64_t>(dim));
    }
    e.offset = cur.u64("an entry's offset");
    e.nbytes = cur.u64("an entry's size");
    TUTTI_CHECK_ARG(e.nbytes == elements * size_of(e.dtype) && e.offset >= data_end && e.offset <= data_limit &&
                        e.nbytes <= data_limit - e.offset,
                    "checkpoint '", path, "' is corrupt: entry '", e.name, "' (", name_of(e.dtype), " ",
                    shape_str(e.shape), ") claims bytes [", e.offset, ", ", e.offset + e.nbytes, ") of a data region [",
                    data_end, ", ", data_limit, ")");
    data_end = e.offset + e.nbytes;
    entries.push_back(std::move(e));
  }

  // Data, straight into the tensors, with the whole-file crc computed on the way.
  std::uint32_t crc = crc_update(0, header.data(), header.size());
  std::uint64_t at = header_size;
  std::vector<unsigned char> skip(kAlign);
  auto read_gap = [&](std::uint64_t to) {
    while (at < to) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(to - at, skip.size()));
      read_all(fd.get(), skip.data(), n, path, at, file_size);
      crc = crc_update(crc, skip.data(), n);
      at += n;
    }
  };
  for (const Entry& e : entries) {
    read_gap(e.offset);
    Tensor t = Tensor::empty(e.shape, e.dtype);
    read_all(fd.get(), t.data(), e.nbytes, path, at, file_size);
    crc = crc_update(crc, t.data(), e.nbytes);
    at += e.nbytes;
    out.state[e.name] = std::move(t);
  }
  read_gap(data_limit);
  unsigned char trailer[kTrailerBytes];
  read_all(fd.get(), trailer, kTrailerBytes, path, at, file_size);
  const std::uint32_t stored_crc = get_u32_le(trailer);
  TUTTI_CHECK_ARG(stored_crc == crc, "checkpoint '", path, "' is corrupt: checksum mismatch: stored ",
                  hex32(stored_crc), " != computed ", hex32(crc));
  TUTTI_CHECK_ARG(out.state.size() == entries.size(), "checkpoint '", path, "' is corrupt: it names an entry twice");
  return out;
}

// ---- compatibility checks ---------------------------------------------------------------

void check_state_matches(const StateDict& loaded, const StateDict& expected, const std::string& source,
                         const std::string& prefix) {
  auto in_scope = [&](const std::string& k) { return k.compare(0, prefix.size(), prefix) == 0; };
  for (const auto& [name, want] : expected) {
    if (!in_scope(name)) continue;
    const auto it = loaded.find(name);
    TUTTI_CHECK_ARG(it != loaded.end(), "checkpoint '", source, "' is for another model: it has no entry '", name,
                    "' (", name_of(want.dtype()), " ", shape_str(want.shape()), ")");
    const Tensor& got = it->second;
    TUTTI_CHECK_ARG(got.shape() == want.shape(), "checkpoint '", source, "' is for another model: entry '", name,
                    "' has shape ", shape_str(got.shape()), " in the checkpoint but ", shape_str(want.shape()),
                    " here");
    TUTTI_CHECK_ARG(got.dtype() == want.dtype(), "checkpoint '", source, "' is for another model: entry '", name,
                    "' is ", name_of(got.dtype()), " in the checkpoint but ", name_of(want.dtype()), " here");
  }
  for (const auto& [name, got] : loaded) {
    if (!in_scope(name)) continue;
    TUTTI_CHECK_ARG(expected.count(name) == 1, "checkpoint '", source, "' is for another model: it has an entry '",
                    name, "' (", name_of(got.dtype()), " ", shape_str(got.shape()), ") that this one does not");
  }
}

void add_prefixed(StateDict& into, const std::string& prefix, const StateDict& part) {
  for (const auto& [name, t] : part) {
    const auto [it, inserted] = into.emplace(prefix + name, t);
    TUTTI_CHECK_ARG(inserted, "add_prefixed: the state already has an entry '", it->first, "'");
  }
}

StateDict strip_prefix(const StateDict& state, const std::string& prefix) {
  StateDict out;
  for (auto it = state.lower_bound(prefix); it != state.end() && it->first.compare(0, prefix.size(), prefix) == 0;
       ++it) {
    out.emplace(it->first.substr(prefix.size()), it->second);
  }
  return out;
}

void check_metadata(const Checkpoint& checkpoint, const std::string& key, const std::string& expected,
                    const std::string& source) {
  const auto it = checkpoint.metadata.find(key);
  TUTTI_CHECK_ARG(it != checkpoint.metadata.end(), "checkpoint '", source, "' has no '", key, "' (expected '", expected,
                  "')");
  TUTTI_CHECK_ARG(it->second == expected, "checkpoint '", source, "' is for another model: ", key, " is '", it->second,
                  "' in the checkpoint but '", expected, "' here");
}

}  // namespace tutti::io
