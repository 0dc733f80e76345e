// Fuzzes io::load_checkpoint, and the in-memory reader of the same format that train::Run's
// memory snapshots use (io::detail::parse_checkpoint_bytes): both run the one parser, so on every
// input they must agree (both refuse with InvalidArgument, or both return the same tensors and
// metadata), and so must the header-only and verifying readers on what they return.
#include <cstdlib>
#include <cstring>
#include <optional>

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = tutti::fuzz::input_file(data, size, "checkpoint.tckp");
  const auto from_file = refused_or([&] { return tutti::io::load_checkpoint(path); });
  const auto from_memory = refused_or([&] { return tutti::io::detail::parse_checkpoint_bytes(data, size, path); });
  if (from_file.has_value() != from_memory.has_value()) std::abort();
  if (!from_file) return 0;
  if (!same(*from_file, *from_memory)) std::abort();
  // What the header-only and verifying readers return of a good file.
  const auto header = tutti::io::detail::load_checkpoint_file(path, /*metadata_only=*/true);
  const auto verified = tutti::io::detail::verify_checkpoint_bytes(data, size, path);
  if (header.metadata != from_file->metadata || verified.metadata != from_file->metadata) std::abort();
  return 0;
}
