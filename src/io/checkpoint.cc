#include "tutti/io/checkpoint.h"

#include <optional>

#include "io/checkpoint_file.h"
#include "tutti/core/trace.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

namespace tutti::io {
namespace {

using detail::crc_update;
using detail::Fd;
using detail::header_crc;
using detail::kAlign;
using detail::kFixedHeaderBytes;
using detail::kMagic;
using detail::kMaxNdim;
using detail::kTrailerBytes;
using detail::throw_errno;
constexpr int kNumDTypes = 5;  // f32, f16, bf16, i32, i64

std::string hex32(std::uint32_t v) {
  static const char* kDigits = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 7; i >= 0; --i) s += kDigits[(v >> (4 * i)) & 0xF];
  return s;
}

std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint32_t get_u32_le(const unsigned char* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24;
}

// Where a checkpoint is read from: a file (sequentially) or bytes in memory. read() takes exactly
// n bytes at `offset` (where the previous read ended), else throws the truncation message.
class Source {
 public:
  virtual ~Source() = default;
  virtual void read(void* data, std::size_t n, std::uint64_t offset, std::uint64_t expected_size) = 0;
};

class FileSource final : public Source {
 public:
  FileSource(int fd, const std::string& path) : fd_(fd), path_(path) {}
  void read(void* data, std::size_t n, std::uint64_t offset, std::uint64_t expected_size) override {
    auto* p = static_cast<unsigned char*>(data);
    std::uint64_t at = offset;
    while (n > 0) {
      const ssize_t r = ::read(fd_, p, std::min<std::size_t>(n, std::size_t{1} << 30));
      if (r < 0) {
        if (errno == EINTR) continue;
        throw_errno("read", path_, errno);
      }
      if (r == 0) {
        TUTTI_THROW(InvalidArgument, "checkpoint '", path_, "' is truncated at byte ", at, " of ", expected_size);
      }
      p += r;
      at += static_cast<std::uint64_t>(r);
      n -= static_cast<std::size_t>(r);
    }
  }

 private:
  int fd_;
  const std::string& path_;
};

class MemorySource final : public Source {
 public:
  MemorySource(const unsigned char* bytes, std::uint64_t size, const std::string& name)
      : bytes_(bytes), size_(size), name_(name) {}
  void read(void* data, std::size_t n, std::uint64_t offset, std::uint64_t expected_size) override {
    if (offset > size_ || n > size_ - offset) {
      TUTTI_THROW(InvalidArgument, "checkpoint '", name_, "' is truncated at byte ", size_, " of ", expected_size);
    }
    if (n > 0) std::memcpy(data, bytes_ + offset, n);
  }

 private:
  const unsigned char* bytes_;
  std::uint64_t size_;
  const std::string& name_;
};

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

}  // namespace

// ---- save ----------------------------------------------------------------------------------

void save_checkpoint(const std::string& path, const StateDict& state, const Metadata& metadata) {
  std::optional<trace::Span> span;
  if (trace::on()) span.emplace("checkpoint save", "checkpoint");
  ErrorContext context("saving checkpoint '" + path + "'");
  TUTTI_CHECK_ARG(!path.empty(), "save_checkpoint: empty path");
  // Every entry checked before anything is copied or any file touched.
  const detail::FilePlan plan = detail::plan_checkpoint(state, metadata, "save_checkpoint");
  detail::write_checkpoint_file(path, plan, detail::host_data(state).data);
}

// ---- load ----------------------------------------------------------------------------------

namespace {

// What parse_checkpoint returns: everything; the metadata once the header is verified (no data
// read); or the metadata once every checksum is verified (the data read but not kept).
enum class Parse { everything, metadata, verified_metadata };

// The reading half: `actual_size` bytes from `source`; `path` names them in messages.
Checkpoint parse_checkpoint(Source& source, std::uint64_t actual_size, const std::string& path, Parse parse) {
  // Fixed header: magic, version, sizes.
  std::vector<unsigned char> header(kFixedHeaderBytes);
  const std::size_t fixed_available = static_cast<std::size_t>(std::min<std::uint64_t>(actual_size, kFixedHeaderBytes));
  source.read(header.data(), fixed_available, 0, actual_size);
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
  source.read(header.data() + kFixedHeaderBytes, header_size - kFixedHeaderBytes, kFixedHeaderBytes, actual_size);
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
  if (parse == Parse::metadata) return out;
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
  // Gaps are alignment padding; a verification reads the tensors' bytes through the same buffer.
  const bool keep = parse == Parse::everything;
  std::vector<unsigned char> skip(keep ? kAlign : std::size_t{1} << 20);
  auto read_gap = [&](std::uint64_t to) {
    while (at < to) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(to - at, skip.size()));
      source.read(skip.data(), n, at, file_size);
      crc = crc_update(crc, skip.data(), n);
      at += n;
    }
  };
  std::set<std::string> names;
  for (const Entry& e : entries) {
    TUTTI_CHECK_ARG(names.insert(e.name).second, "checkpoint '", path, "' is corrupt: it names entry '", e.name,
                    "' twice");
    if (!keep) {
      read_gap(e.offset + e.nbytes);
      continue;
    }
    read_gap(e.offset);
    Tensor t = Tensor::empty(e.shape, e.dtype);
    source.read(t.data(), e.nbytes, at, file_size);
    crc = crc_update(crc, t.data(), e.nbytes);
    at += e.nbytes;
    out.state[e.name] = std::move(t);
  }
  read_gap(data_limit);
  unsigned char trailer[kTrailerBytes];
  source.read(trailer, kTrailerBytes, at, file_size);
  const std::uint32_t stored_crc = get_u32_le(trailer);
  TUTTI_CHECK_ARG(stored_crc == crc, "checkpoint '", path, "' is corrupt: checksum mismatch: stored ",
                  hex32(stored_crc), " != computed ", hex32(crc));
  return out;
}

}  // namespace

Checkpoint load_checkpoint(const std::string& path) { return detail::load_checkpoint_file(path, false); }

namespace detail {

Checkpoint load_checkpoint_file(const std::string& path, bool metadata_only) {
  ErrorContext context("loading checkpoint '" + path + "'");
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) TUTTI_THROW(InvalidArgument, "checkpoint '", path, "' does not exist");
    throw_errno("open", path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno("fstat", path, errno);
  TUTTI_CHECK_ARG(S_ISREG(st.st_mode), "checkpoint '", path, "' is not a regular file");
  FileSource source(fd.get(), path);
  return parse_checkpoint(source, static_cast<std::uint64_t>(st.st_size), path,
                          metadata_only ? Parse::metadata : Parse::everything);
}

Checkpoint parse_checkpoint_bytes(const void* bytes, std::uint64_t size, const std::string& name) {
  MemorySource source(static_cast<const unsigned char*>(bytes), size, name);
  return parse_checkpoint(source, size, name, Parse::everything);
}

Checkpoint verify_checkpoint_bytes(const void* bytes, std::uint64_t size, const std::string& name) {
  MemorySource source(static_cast<const unsigned char*>(bytes), size, name);
  return parse_checkpoint(source, size, name, Parse::verified_metadata);
}

}  // namespace detail

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
