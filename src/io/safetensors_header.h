// The JSON half of safetensors (include/tutti/io/safetensors.h describes the format): parsing and
// validating a header from memory, and encoding one. No file is touched here, so the fuzz target
// and the tests reach the same code as SafetensorsFile. Internal header: not installed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tutti/io/safetensors.h"

namespace tutti::io::detail {

// Bits per element of a safetensors dtype ("F32" -> 32, "F4" -> 4), empty for a name the format
// does not define.
std::optional<unsigned> safetensors_dtype_bits(std::string_view name);
// The safetensors spelling of a tutti dtype: "F32", "F16", "BF16", "I32", "I64".
const char* safetensors_dtype_name(DType dtype);

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // sorted by position in the buffer
  Metadata metadata;
};

// Parses and validates `json` (the header's N bytes, padding included) for a data buffer of
// `buffer_bytes` bytes: every check the format's comment lists. `path` names the file in the
// InvalidArgument messages.
SafetensorsHeader parse_safetensors_header(std::string_view json, std::uint64_t buffer_bytes, const std::string& path);

// Parses JSON of untrusted origin for `what` ("safetensors file 'x'", "index 'y'"): at most
// `max_depth` levels of objects and arrays (the top level is 1), no key twice in one object (the
// message names it); an InvalidArgument naming `what` otherwise, or when it is not JSON.
nlohmann::json parse_untrusted_json(std::string_view text, int max_depth, const std::string& what);

// Where a tensor goes: its header entry, in buffer order (begin/end filled in).
struct SafetensorsLayout {
  std::string header;              // the JSON, padded with spaces to a multiple of 8 bytes
  std::vector<std::size_t> order;  // positions in `tensors`, in buffer order
  std::uint64_t buffer_bytes = 0;
};
// Validates names and metadata (`call` names the caller in messages) and lays the tensors out as
// save_safetensors describes. Reads names, shapes and dtypes only: tensors may be on any device.
SafetensorsLayout plan_safetensors(const NamedTensors& tensors, const Metadata& metadata, const char* call);

}  // namespace tutti::io::detail
