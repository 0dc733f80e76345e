// Folders of safetensors files as Hugging Face writes them: one file, or shards and an index.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "io/checkpoint_file.h"
#include "io/safetensors_header.h"
#include "tutti/io/safetensors.h"

namespace tutti::io {
namespace {

namespace fs = std::filesystem;
using detail::throw_errno;

std::string single_name(const std::string& prefix) { return prefix + ".safetensors"; }
std::string index_name(const std::string& prefix) { return prefix + ".safetensors.index.json"; }
// "model-00001-of-00003.safetensors", Hugging Face's numbering (from 1, five digits).
std::string shard_name(const std::string& prefix, std::size_t k, std::size_t n) {
  char digits[40];
  std::snprintf(digits, sizeof digits, "-%05zu-of-%05zu", k, n);
  return prefix + digits + ".safetensors";
}
// True for a name shard_name() writes for `prefix`, whatever the numbers.
bool is_shard_name(const std::string& name, const std::string& prefix) {
  const std::string tail = ".safetensors";
  // prefix + "-" + 5 digits + "-of-" + 5 digits + tail
  if (name.size() != prefix.size() + 1 + 5 + 4 + 5 + tail.size()) return false;
  if (name.compare(0, prefix.size(), prefix) != 0 || name.compare(name.size() - tail.size(), tail.size(), tail) != 0) {
    return false;
  }
  const std::string middle = name.substr(prefix.size(), 1 + 5 + 4 + 5);
  for (std::size_t i = 0; i < middle.size(); ++i) {
    const bool digit = (i >= 1 && i <= 5) || i >= 10;
    if (digit ? !(middle[i] >= '0' && middle[i] <= '9') : middle[i] != "-xxxxx-of-"[i]) return false;
  }
  return true;
}

bool exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

// The whole of a small file (an index), refusing one larger than `limit` before reading it.
std::string read_small_file(const std::string& path, std::uint64_t limit) {
  detail::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) TUTTI_THROW(InvalidArgument, "safetensors index '", path, "' does not exist");
    throw_errno("open", path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno("fstat", path, errno);
  TUTTI_CHECK_ARG(S_ISREG(st.st_mode), "safetensors index '", path, "' is not a regular file");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  TUTTI_CHECK_ARG(size <= limit, "safetensors index '", path, "' is ", size, " bytes, more than the ", limit,
                  " an index may have");
  std::string text(static_cast<std::size_t>(size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(fd.get(), text.data() + got, text.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno("read", path, errno);
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  text.resize(got);
  return text;
}

// A shard's name in an index must be a file of the folder: no path, so that an index cannot
// send the reader elsewhere.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

// ---- reading -------------------------------------------------------------------------------

SafetensorsFolder::SafetensorsFolder(const std::string& dir, const std::string& prefix) : dir_(dir) {
  ErrorContext context("opening safetensors folder '" + dir + "'");
  const fs::path base(dir);
  const std::string single = (base / single_name(prefix)).string();
  const std::string index = (base / index_name(prefix)).string();
  if (exists(single)) {
    files_.emplace_back(single);
    for (const SafetensorsEntry& e : files_[0].entries()) where_.emplace(e.name, 0);
    return;
  }
  TUTTI_CHECK_ARG(exists(index), "safetensors folder '", dir, "' holds neither ", single_name(prefix), " nor ",
                  index_name(prefix));

  // The index: {"metadata": {...}, "weight_map": {name: shard}}; other keys are ignored.
  const std::string what = "safetensors index '" + index + "'";
  const nlohmann::json root = detail::parse_untrusted_json(read_small_file(index, kSafetensorsMaxHeaderBytes), 3, what);
  TUTTI_CHECK_ARG(root.is_object(), what, " is a JSON ", root.type_name(), ", not an object");
  const auto map_it = root.find("weight_map");
  TUTTI_CHECK_ARG(map_it != root.end(), what, " has no \"weight_map\"");
  TUTTI_CHECK_ARG(map_it->is_object(), what, ": \"weight_map\" is a JSON ", map_it->type_name(), ", not an object");
  std::map<std::string, std::string> shard_of;  // tensor -> shard, sorted by tensor
  std::set<std::string> shards;
  for (const auto& [name, shard] : map_it->items()) {
    TUTTI_CHECK_ARG(shard.is_string(), what, ": tensor '", name, "' is mapped to a JSON ", shard.type_name(),
                    ", not a file name");
    const auto& file = shard.get_ref<const std::string&>();
    TUTTI_CHECK_ARG(plain_file_name(file), what, ": tensor '", name, "' is mapped to '", file,
                    "', which is not a file name in the folder");
    shard_of.emplace(name, file);
    shards.insert(file);
  }

  // Each shard opened once, in name order.
  std::map<std::string, std::size_t> position;
  for (const std::string& shard : shards) {
    const std::string path = (base / shard).string();
    if (!exists(path)) {
      const auto named =
          std::find_if(shard_of.begin(), shard_of.end(), [&](const auto& kv) { return kv.second == shard; });
      TUTTI_THROW(InvalidArgument, what, " maps tensor '", named->first, "' to shard '", shard,
                  "', which does not exist in the folder");
    }
    position.emplace(shard, files_.size());
    files_.emplace_back(path);
  }
  for (const auto& [name, shard] : shard_of) {
    const std::size_t k = position.at(shard);
    TUTTI_CHECK_ARG(files_[k].contains(name), what, " maps tensor '", name, "' to shard '", shard,
                    "', which does not hold it");
    where_.emplace(name, k);
  }
  for (const SafetensorsFile& file : files_) {
    for (const SafetensorsEntry& e : file.entries()) {
      const auto it = shard_of.find(e.name);
      TUTTI_CHECK_ARG(it != shard_of.end() && (base / it->second).string() == file.path(), "safetensors file '",
                      file.path(), "' holds tensor '", e.name, "', which ", what,
                      it == shard_of.end() ? " does not list" : " maps to shard '" + it->second + "'");
    }
  }
}

std::vector<std::string> SafetensorsFolder::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, k] : where_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

const SafetensorsFile& SafetensorsFolder::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  TUTTI_CHECK_ARG(it != where_.end(), "safetensors folder '", dir_, "' has no tensor '", name, "'");
  return files_[it->second];
}

Tensor SafetensorsFolder::read(const std::string& name, std::optional<DType> as) const {
  return file_of(name).read(name, as);
}

Tensor SafetensorsFolder::read_elements(const std::string& name, std::int64_t first, std::int64_t count,
                                        std::optional<DType> as) const {
  return file_of(name).read_elements(name, first, count, as);
}

void SafetensorsFolder::read_elements_into(const std::string& name, std::int64_t first, const Tensor& out) const {
  file_of(name).read_elements_into(name, first, out);
}

StateDict SafetensorsFolder::read_all(std::optional<DType> as) const {
  StateDict out;
  for (const SafetensorsFile& file : files_) out.merge(file.read_all(as));
  return out;
}

// ---- writing -------------------------------------------------------------------------------

std::vector<std::string> save_safetensors_folder(const std::string& dir, const NamedTensors& tensors,
                                                 const Metadata& metadata, const SafetensorsFolderOptions& options) {
  ErrorContext context("saving safetensors folder '" + dir + "'");
  const char* call = "save_safetensors_folder";
  TUTTI_CHECK_ARG(!dir.empty(), call, ": empty folder");
  TUTTI_CHECK_ARG(options.max_shard_bytes > 0, call, ": max_shard_bytes must be positive");
  TUTTI_CHECK_ARG(plain_file_name(options.prefix), call, ": prefix '", options.prefix, "' is not a file name (no '/')");
  // Every name, dtype and string checked once for the whole model (a duplicate across shards
  // included), before any file is written.
  detail::plan_safetensors(tensors, metadata, call);

  // Hugging Face's cut (huggingface_hub's split_state_dict_into_shards): a tensor larger than
  // the limit gets a shard of its own where it comes, and the shard being filled goes on after
  // it; otherwise a new shard starts when the next tensor would take the current one past the
  // limit.
  std::vector<NamedTensors> shards;
  NamedTensors current;
  std::uint64_t current_bytes = 0, total = 0;
  for (const auto& named : tensors) {
    const std::uint64_t n = named.second.nbytes();
    total += n;
    if (n > options.max_shard_bytes) {
      shards.push_back({named});
      continue;
    }
    if (current_bytes + n > options.max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(named);
    current_bytes += n;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_errno("create_directories", dir, ec.value());
  const fs::path base(dir);
  std::vector<std::string> written;
  if (shards.size() == 1) {
    written.push_back(single_name(options.prefix));
    save_safetensors((base / written[0]).string(), shards[0], metadata);
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    for (std::size_t k = 0; k < shards.size(); ++k) {
      written.push_back(shard_name(options.prefix, k + 1, shards.size()));
      save_safetensors((base / written.back()).string(), shards[k], metadata);
      for (const auto& named : shards[k]) weight_map[named.first] = written.back();
    }
    // nlohmann::json sorts keys, as Python's json.dumps(sort_keys=True) does.
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
    const std::string text = index.dump(2) + "\n";
    written.push_back(index_name(options.prefix));
    detail::write_file_atomically((base / written.back()).string(), text.data(), text.size());
  }

  // What another layout or shard count of this prefix left would mislead a reader: removed.
  const std::set<std::string> keep(written.begin(), written.end());
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (keep.count(name) != 0) continue;
    if (name == single_name(options.prefix) || name == index_name(options.prefix) ||
        is_shard_name(name, options.prefix)) {
      stale.push_back(it->path());
    }
  }
  for (const fs::path& p : stale) {
    if (!fs::remove(p, ec) && ec) throw_errno("remove (a stale file of an earlier save)", p.string(), ec.value());
  }
  return written;
}

}  // namespace tutti::io
