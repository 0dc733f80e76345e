// Fuzzes io::load_checkpoint, and the in-memory reader of the same format that train::Run's
// memory snapshots use (io::detail::parse_checkpoint_bytes): both run the one parser, so on every
// input they must agree (both refuse with InvalidArgument, or both return the same tensors and
// metadata), and so must the header-only and verifying readers on what they return.
//
// Each input is tried twice: as it is, and with its two checksums (the header's and the file's)
// recomputed, since a mutation almost never keeps a crc32 right and the parser would otherwise
// stop at the first check, never reaching the metadata and the entry table.
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "fuzz_util.h"
#include "io/checkpoint_file.h"
#include "tutti/io/checkpoint.h"

namespace {

using tutti::InvalidArgument;
using tutti::io::Checkpoint;

template <typename F>
std::optional<Checkpoint> refused_or(F&& read) {
  try {
    return read();
  } catch (const InvalidArgument&) {
    return std::nullopt;
  }
}

bool same(const Checkpoint& a, const Checkpoint& b) {
  if (a.metadata != b.metadata || a.state.size() != b.state.size()) return false;
  for (const auto& [name, t] : a.state) {
    const auto it = b.state.find(name);
    if (it == b.state.end()) return false;
    const tutti::Tensor& u = it->second;
    if (t.dtype() != u.dtype() || t.shape() != u.shape() ||
        (t.nbytes() > 0 && std::memcmp(t.data(), u.data(), t.nbytes()) != 0)) {
      return false;
    }
  }
  return true;
}

void check(const std::uint8_t* data, std::size_t size) {
  const std::string path = tutti::fuzz::input_file(data, size, "checkpoint.tckp");
  const auto from_file = refused_or([&] { return tutti::io::load_checkpoint(path); });
  const auto from_memory = refused_or([&] { return tutti::io::detail::parse_checkpoint_bytes(data, size, path); });
  if (from_file.has_value() != from_memory.has_value()) std::abort();
  if (!from_file) return;
  if (!same(*from_file, *from_memory)) std::abort();
  // What the header-only and verifying readers return of a good file.
  const auto header = tutti::io::detail::load_checkpoint_file(path, /*metadata_only=*/true);
  const auto verified = tutti::io::detail::verify_checkpoint_bytes(data, size, path);
  if (header.metadata != from_file->metadata || verified.metadata != from_file->metadata) std::abort();
}

void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  check(data, size);
  // The same bytes with the header crc (over [0, 40) and [48, H), H at offset 24) and the file's
  // trailer crc (over everything before the last 4 bytes) made right.
  if (size < tutti::io::detail::kFixedHeaderBytes + 4) return 0;
  std::vector<std::uint8_t> fixed(data, data + size);
  std::uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | fixed[24 + i];
  if (header_size >= tutti::io::detail::kFixedHeaderBytes && header_size <= size) {
    put_u32(fixed.data() + 40, tutti::io::detail::header_crc(fixed.data(), static_cast<std::size_t>(header_size)));
  }
  put_u32(fixed.data() + size - 4, tutti::io::detail::crc_update(0, fixed.data(), size - 4));
  check(fixed.data(), fixed.size());
  return 0;
}
