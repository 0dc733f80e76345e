// One safetensors file: opening (the header through safetensors_header.cc), reading tensors and
// ranges of their elements with pread, and writing a file atomically.
#include "tutti/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "io/checkpoint_file.h"
#include "io/safetensors_header.h"
#include "tutti/core/stream.h"

namespace tutti::io {

static_assert(std::endian::native == std::endian::little, "safetensors stores tensors little-endian");

namespace {

using detail::throw_errno;

// Reads exactly `n` bytes at `offset`; a file that ends first (it shrank since it was opened)
// is an InvalidArgument naming it.
void pread_all(int fd, void* data, std::size_t n, std::uint64_t offset, const std::string& path) {
  auto* p = static_cast<unsigned char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno("pread", path, errno);
    }
    TUTTI_CHECK_ARG(r > 0, "safetensors file '", path, "' is truncated: it ends at byte ", offset, ", ", n,
                    " bytes short of what its header promised (was it changed after it was opened?)");
    p += r;
    offset += static_cast<std::uint64_t>(r);
    n -= static_cast<std::size_t>(r);
  }
}

float load_float(DType dtype, const unsigned char* p) {
  switch (dtype) {
    case DType::f32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::f16: {
      std::uint16_t b;
      std::memcpy(&b, p, 2);
      return half_bits_to_float(b);
    }
    case DType::bf16: {
      std::uint16_t b;
      std::memcpy(&b, p, 2);
      return bf16_bits_to_float(b);
    }
    default: break;
  }
  TUTTI_THROW(Error, "safetensors: load_float of ", name_of(dtype));
}

void store_float(DType dtype, float v, unsigned char* p) {
  switch (dtype) {
    case DType::f32: std::memcpy(p, &v, 4); return;
    case DType::f16: {
      const std::uint16_t b = float_to_half_bits(v);
      std::memcpy(p, &b, 2);
      return;
    }
    case DType::bf16: {
      const std::uint16_t b = float_to_bf16_bits(v);
      std::memcpy(p, &b, 2);
      return;
    }
    default: break;
  }
  TUTTI_THROW(Error, "safetensors: store_float of ", name_of(dtype));
}

}  // namespace

std::int64_t SafetensorsEntry::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;  // validated at opening: no partial product overflows
  return n;
}

// ---- opening -------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  ErrorContext context("opening safetensors file '" + path + "'");
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    if (errno == ENOENT) TUTTI_THROW(InvalidArgument, "safetensors file '", path, "' does not exist");
    throw_errno("open", path, errno);
  }
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw_errno("fstat", path, errno);
    TUTTI_CHECK_ARG(S_ISREG(st.st_mode), "safetensors file '", path, "' is not a regular file");
    const auto size = static_cast<std::uint64_t>(st.st_size);
    TUTTI_CHECK_ARG(size >= 8, "safetensors file '", path, "' is ", size,
                    " bytes, shorter than the format's 8-byte header length: not a safetensors file");
    unsigned char length[8];
    pread_all(fd_, length, 8, 0, path);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
    TUTTI_CHECK_ARG(n <= kSafetensorsMaxHeaderBytes, "safetensors file '", path, "' declares a header of ", n,
                    " bytes, more than the ", kSafetensorsMaxHeaderBytes,
                    " the format allows: not a safetensors file, or a damaged one");
    TUTTI_CHECK_ARG(n <= size - 8, "safetensors file '", path, "' declares a header of ", n,
                    " bytes, past the end of its ", size, " bytes: truncated or damaged");
    std::string header(static_cast<std::size_t>(n), '\0');
    pread_all(fd_, header.data(), header.size(), 8, path);
    data_start_ = 8 + n;
    detail::SafetensorsHeader parsed = detail::parse_safetensors_header(header, size - data_start_, path);
    entries_ = std::move(parsed.entries);
    metadata_ = std::move(parsed.metadata);
    index_.reserve(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_start_(other.data_start_),
      entries_(std::move(other.entries_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_start_ = other.data_start_;
    entries_ = std::move(other.entries_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = index_.find(name);
  TUTTI_CHECK_ARG(it != index_.end(), "safetensors file '", path_, "' has no tensor '", name, "'");
  return entries_[it->second];
}

// ---- reading -------------------------------------------------------------------------------

void SafetensorsFile::read_elements_into(const std::string& name, std::int64_t first, const Tensor& out) const {
  const SafetensorsEntry& e = entry(name);
  TUTTI_CHECK_ARG(e.tutti_dtype.has_value(), "safetensors file '", path_, "': tensor '", name, "' has dtype ", e.dtype,
                  ", which tutti does not read (it reads F32, F16, BF16, I32 and I64)");
  const DType from = *e.tutti_dtype;
  TUTTI_CHECK_ARG(out.defined() && out.device().is_cpu(), "safetensors file '", path_, "': reading tensor '", name,
                  "' needs a defined CPU tensor to read into, got ", out.defined() ? out.str() : "an undefined one");
  const DType to = out.dtype();
  TUTTI_CHECK_ARG(from == to || (is_floating(from) && is_floating(to)), "safetensors file '", path_, "': tensor '",
                  name, "' is ", e.dtype, ", which cannot be read as ", name_of(to),
                  " (only f32, f16 and bf16 convert to each other)");
  const std::int64_t numel = e.numel();
  const std::int64_t count = out.numel();
  TUTTI_CHECK_ARG(first >= 0 && first <= numel && count <= numel - first, "safetensors file '", path_, "': elements [",
                  first, ", ", first, " + ", count, ") are not within tensor '", name, "' (", e.dtype, " ",
                  shape_str(e.shape), ", ", numel, " elements)");
  if (count == 0) return;
  const std::size_t from_size = size_of(from);
  const std::uint64_t offset = data_start_ + e.begin + static_cast<std::uint64_t>(first) * from_size;
  auto* dst = static_cast<unsigned char*>(out.data());
  if (from == to) {
    pread_all(fd_, dst, static_cast<std::size_t>(count) * from_size, offset, path_);
    return;
  }
  // Converted in pieces through a small buffer: never the whole tensor twice.
  constexpr std::int64_t kChunk = std::int64_t{1} << 16;
  std::vector<unsigned char> buffer(static_cast<std::size_t>(std::min(count, kChunk)) * from_size);
  const std::size_t to_size = size_of(to);
  for (std::int64_t done = 0; done < count;) {
    const std::int64_t n = std::min(count - done, kChunk);
    pread_all(fd_, buffer.data(), static_cast<std::size_t>(n) * from_size,
              offset + static_cast<std::uint64_t>(done) * from_size, path_);
    for (std::int64_t i = 0; i < n; ++i) {
      store_float(to, load_float(from, buffer.data() + i * from_size), dst + (done + i) * to_size);
    }
    done += n;
  }
}

Tensor SafetensorsFile::read(const std::string& name, std::optional<DType> as) const {
  const SafetensorsEntry& e = entry(name);
  // The dtype checks first, so that a tensor tutti cannot hold is refused before it is allocated.
  TUTTI_CHECK_ARG(e.tutti_dtype.has_value(), "safetensors file '", path_, "': tensor '", name, "' has dtype ", e.dtype,
                  ", which tutti does not read (it reads F32, F16, BF16, I32 and I64)");
  const DType to = as.value_or(*e.tutti_dtype);
  TUTTI_CHECK_ARG(to == *e.tutti_dtype || (is_floating(to) && is_floating(*e.tutti_dtype)), "safetensors file '", path_,
                  "': tensor '", name, "' is ", e.dtype, ", which cannot be read as ", name_of(to),
                  " (only f32, f16 and bf16 convert to each other)");
  Tensor t = Tensor::empty(e.shape, to);
  read_elements_into(name, 0, t);
  return t;
}

Tensor SafetensorsFile::read_elements(const std::string& name, std::int64_t first, std::int64_t count,
                                      std::optional<DType> as) const {
  const SafetensorsEntry& e = entry(name);
  TUTTI_CHECK_ARG(e.tutti_dtype.has_value(), "safetensors file '", path_, "': tensor '", name, "' has dtype ", e.dtype,
                  ", which tutti does not read (it reads F32, F16, BF16, I32 and I64)");
  const std::int64_t numel = e.numel();
  TUTTI_CHECK_ARG(first >= 0 && count >= 0 && first <= numel && count <= numel - first, "safetensors file '", path_,
                  "': elements [", first, ", ", first, " + ", count, ") are not within tensor '", name, "' (", e.dtype,
                  " ", shape_str(e.shape), ", ", numel, " elements)");
  Tensor t = Tensor::empty({count}, as.value_or(*e.tutti_dtype));
  read_elements_into(name, first, t);
  return t;
}

StateDict SafetensorsFile::read_all(std::optional<DType> as) const {
  StateDict out;
  for (const SafetensorsEntry& e : entries_) {
    // Integer tensors stay integers when floats are converted.
    const bool convert = as && e.tutti_dtype && is_floating(*e.tutti_dtype);
    out[e.name] = read(e.name, convert ? as : std::nullopt);
  }
  return out;
}

// ---- writing -------------------------------------------------------------------------------

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  ErrorContext context("saving safetensors file '" + path + "'");
  TUTTI_CHECK_ARG(!path.empty(), "save_safetensors: empty path");
  const detail::SafetensorsLayout layout = detail::plan_safetensors(tensors, metadata, "save_safetensors");
  detail::write_file_atomically(path, [&](int fd, const std::string& tmp) {
    unsigned char length[8];
    const std::uint64_t n = layout.header.size();
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
    detail::write_all(fd, length, 8, tmp);
    detail::write_all(fd, layout.header.data(), layout.header.size(), tmp);
    for (std::size_t i : layout.order) {
      const Tensor& t = tensors[i].second;
      if (t.nbytes() == 0) continue;
      if (t.device().is_cpu()) {
        detail::write_all(fd, t.data(), t.nbytes(), tmp);
      } else {
        // One tensor at a time on the host, not the whole model.
        Stream stream = Stream::default_for(t.device());
        const Tensor host = t.to(Device::cpu(), stream);
        stream.synchronize();
        detail::write_all(fd, host.data(), host.nbytes(), tmp);
      }
    }
  });
}

}  // namespace tutti::io
