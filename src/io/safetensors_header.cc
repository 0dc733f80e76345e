#include "io/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

namespace tutti::io::detail {
namespace {

using json = nlohmann::json;

struct DtypeInfo {
  const char* name;
  unsigned bits;
  std::optional<DType> tutti;
};

// Every dtype of the format, with the size of an element in bits (the 4- and 6-bit floats are
// packed: a tensor of them must fill whole bytes).
const DtypeInfo kDtypes[] = {
    {"BOOL", 8, std::nullopt},    {"U8", 8, std::nullopt},      {"I8", 8, std::nullopt},
    {"F8_E5M2", 8, std::nullopt}, {"F8_E4M3", 8, std::nullopt}, {"F8_E8M0", 8, std::nullopt},
    {"I16", 16, std::nullopt},    {"U16", 16, std::nullopt},    {"F16", 16, DType::f16},
    {"BF16", 16, DType::bf16},    {"I32", 32, DType::i32},      {"U32", 32, std::nullopt},
    {"F32", 32, DType::f32},      {"F64", 64, std::nullopt},    {"I64", 64, DType::i64},
    {"U64", 64, std::nullopt},    {"C64", 64, std::nullopt},    {"F4", 4, std::nullopt},
    {"F6_E2M3", 6, std::nullopt}, {"F6_E3M2", 6, std::nullopt},
};

const DtypeInfo* find_dtype(std::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

std::string tensor_desc(const SafetensorsEntry& e) {
  return "tensor '" + e.name + "' (" + e.dtype + " " + shape_str(e.shape) + ")";
}

// A non-negative JSON integer that fits `limit`; `what` names the value in the message.
std::uint64_t get_count(const json& v, std::uint64_t limit, const std::string& what) {
  TUTTI_CHECK_ARG(!(v.is_number_integer() && !v.is_number_unsigned()), what, " is negative (", v.dump(), ")");
  TUTTI_CHECK_ARG(v.is_number_unsigned(), what, " is a JSON ", v.type_name(),
                  v.is_number_float() ? " (" + v.dump() + ")" : std::string(), ", not a non-negative integer");
  const std::uint64_t n = v.get<std::uint64_t>();
  TUTTI_CHECK_ARG(n <= limit, what, " is ", n, ", more than ", limit);
  return n;
}

SafetensorsEntry parse_entry(const std::string& name, const json& value, std::uint64_t buffer_bytes,
                             const std::string& file) {
  const std::string tensor = file + ": tensor '" + name + "'";
  TUTTI_CHECK_ARG(value.is_object(), tensor, " is a JSON ", value.type_name(),
                  ", not an object {\"dtype\", \"shape\", \"data_offsets\"}");
  auto field = [&](const char* key) -> const json& {
    const auto it = value.find(key);
    TUTTI_CHECK_ARG(it != value.end(), tensor, " has no \"", key, "\"");
    return *it;
  };
  SafetensorsEntry e;
  e.name = name;

  const json& dtype = field("dtype");
  TUTTI_CHECK_ARG(dtype.is_string(), tensor, ": \"dtype\" is a JSON ", dtype.type_name(), ", not a string");
  e.dtype = dtype.get<std::string>();
  const DtypeInfo* info = find_dtype(e.dtype);
  TUTTI_CHECK_ARG(info != nullptr, tensor, " has an unknown dtype \"", e.dtype, "\"");
  e.tutti_dtype = info->tutti;

  const json& shape = field("shape");
  TUTTI_CHECK_ARG(shape.is_array(), tensor, ": \"shape\" is a JSON ", shape.type_name(), ", not a list");
  // The element count, checked against overflow over the non-zero dimensions, so that the
  // partial products Tensor computes (numel_of) fit in int64 whatever the order of the zeros.
  constexpr std::uint64_t kMaxCount = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::uint64_t nonzero_product = 1;
  bool any_zero = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::uint64_t d =
        get_count(shape[i], kMaxCount, tensor + ": dimension " + std::to_string(i) + " of its shape");
    if (d == 0) {
      any_zero = true;
    } else {
      TUTTI_CHECK_ARG(nonzero_product <= kMaxCount / d, tensor, ": its shape ", shape.dump(),
                      " has more than 2^63 elements");
      nonzero_product *= d;
    }
    e.shape.push_back(static_cast<std::int64_t>(d));
  }
  const std::uint64_t numel = any_zero ? 0 : nonzero_product;

  const json& offsets = field("data_offsets");
  TUTTI_CHECK_ARG(offsets.is_array() && offsets.size() == 2, tensor, ": \"data_offsets\" is ", offsets.dump(),
                  ", not a list [begin, end]");
  const auto u64_max = std::numeric_limits<std::uint64_t>::max();
  e.begin = get_count(offsets[0], u64_max, tensor + ": the begin of its data_offsets");
  e.end = get_count(offsets[1], u64_max, tensor + ": the end of its data_offsets");
  TUTTI_CHECK_ARG(e.begin <= e.end, file, ": ", tensor_desc(e), " has reversed data_offsets [", e.begin, ", ", e.end,
                  "]");
  TUTTI_CHECK_ARG(e.end <= buffer_bytes, file, ": ", tensor_desc(e), " claims bytes [", e.begin, ", ", e.end,
                  ") of a data buffer of ", buffer_bytes, " bytes: the file is truncated or its offsets damaged");
  TUTTI_CHECK_ARG(numel <= u64_max / info->bits, file, ": ", tensor_desc(e), " has too many elements");
  const std::uint64_t bits = numel * info->bits;
  TUTTI_CHECK_ARG(bits % 8 == 0, file, ": ", tensor_desc(e), " holds ", bits, " bits, not a whole number of bytes");
  TUTTI_CHECK_ARG(bits / 8 == e.nbytes(), file, ": ", tensor_desc(e), " needs ", bits / 8,
                  " bytes but its data_offsets [", e.begin, ", ", e.end, ") hold ", e.nbytes());
  return e;
}

Metadata parse_metadata(const json& value, const std::string& file) {
  Metadata out;
  if (value.is_null()) return out;
  TUTTI_CHECK_ARG(value.is_object(), file, ": \"__metadata__\" is a JSON ", value.type_name(),
                  ", not an object of strings");
  for (const auto& [key, v] : value.items()) {
    TUTTI_CHECK_ARG(v.is_string(), file, ": \"__metadata__\" entry '", key, "' is a JSON ", v.type_name(),
                    ", not a string");
    out[key] = v.get<std::string>();
  }
  return out;
}

}  // namespace

std::optional<unsigned> safetensors_dtype_bits(std::string_view name) {
  const DtypeInfo* d = find_dtype(name);
  if (d == nullptr) return std::nullopt;
  return d->bits;
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  TUTTI_THROW(InvalidArgument, "safetensors: no name for dtype ", static_cast<int>(dtype));
}

json parse_untrusted_json(std::string_view text, int max_depth, const std::string& what) {
  // The keys of each object being parsed, innermost last: nlohmann keeps the last of duplicate
  // keys silently, which would hide a tensor named twice.
  std::vector<std::unordered_set<std::string>> keys;
  auto guard = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        // `depth` is 0 for the top level's container.
        TUTTI_CHECK_ARG(depth < max_depth, what, " is nested deeper than the ", max_depth, " levels its format has");
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        TUTTI_CHECK_ARG(keys.empty() || keys.back().insert(key).second, what, " has the key '", key, "' twice",
                        depth == 1 ? " (a name given twice)" : "");
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), guard);
  } catch (const json::exception& e) {
    TUTTI_THROW(InvalidArgument, what, " is not valid JSON: ", e.what());
  }
}

SafetensorsHeader parse_safetensors_header(std::string_view text, std::uint64_t buffer_bytes, const std::string& path) {
  const std::string file = "safetensors file '" + path + "'";
  // Top-level object, entries, and their shape and offset lists.
  const json root = parse_untrusted_json(text, 3, file + ": its header");
  TUTTI_CHECK_ARG(root.is_object(), file, ": its header is a JSON ", root.type_name(), ", not an object");
  SafetensorsHeader out;
  out.entries.reserve(root.size());
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      out.metadata = parse_metadata(value, file);
    } else {
      out.entries.push_back(parse_entry(name, value, buffer_bytes, file));
    }
  }

  // The buffer must be covered exactly: in offset order, each tensor starts where the one
  // before ended (an empty tensor takes no bytes), the last ends at the buffer's end.
  std::sort(out.entries.begin(), out.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  std::uint64_t at = 0;
  const SafetensorsEntry* last = nullptr;  // the tensor whose bytes end at `at`
  for (const SafetensorsEntry& e : out.entries) {
    TUTTI_CHECK_ARG(e.begin >= at, file, ": ", tensor_desc(e), " at bytes [", e.begin, ", ", e.end, ") overlaps ",
                    tensor_desc(*last), " at bytes [", last->begin, ", ", last->end, ")");
    TUTTI_CHECK_ARG(e.begin == at, file, ": bytes [", at, ", ", e.begin, ") of the data buffer, before ",
                    tensor_desc(e), ", belong to no tensor (the format allows no holes)");
    if (e.end > e.begin || last == nullptr) last = &e;
    at = e.end;
  }
  TUTTI_CHECK_ARG(at == buffer_bytes, file, ": bytes [", at, ", ", buffer_bytes, ") at the end of the data buffer",
                  last != nullptr ? ", after " + tensor_desc(*last) + "," : std::string(),
                  " belong to no tensor (the format allows no holes)");
  return out;
}

SafetensorsLayout plan_safetensors(const NamedTensors& tensors, const Metadata& metadata, const char* call) {
  std::unordered_set<std::string_view> names;
  for (const auto& [name, t] : tensors) {
    TUTTI_CHECK_ARG(!name.empty(), call, ": a tensor has an empty name");
    TUTTI_CHECK_ARG(name != "__metadata__", call,
                    ": '__metadata__' is the format's key for metadata, not a tensor name");
    TUTTI_CHECK_ARG(t.defined(), call, ": tensor '", name, "' is undefined");
    TUTTI_CHECK_ARG(names.insert(name).second, call, ": tensor '", name, "' is given twice");
  }
  SafetensorsLayout out;
  out.order.resize(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) out.order[i] = i;
  std::stable_sort(out.order.begin(), out.order.end(), [&](std::size_t a, std::size_t b) {
    return size_of(tensors[a].second.dtype()) > size_of(tensors[b].second.dtype());
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) m[key] = value;
    header["__metadata__"] = std::move(m);
  }
  std::uint64_t at = 0;
  for (std::size_t i : out.order) {
    const auto& [name, t] = tensors[i];
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = safetensors_dtype_name(t.dtype());
    entry["shape"] = t.shape();
    entry["data_offsets"] = nlohmann::ordered_json::array({at, at + t.nbytes()});
    header[name] = std::move(entry);
    at += t.nbytes();
  }
  out.buffer_bytes = at;
  try {
    out.header = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    TUTTI_THROW(InvalidArgument, call, ": a tensor name or metadata string is not valid UTF-8 (", e.what(), ")");
  }
  out.header.append((8 - out.header.size() % 8) % 8, ' ');
  return out;
}

}  // namespace tutti::io::detail
