// Fuzzes io::SafetensorsFolder. The input is one or more files joined by kFileSeparator: one
// file is written as model.safetensors; several as model.safetensors.index.json and then the
// shards model-0000k-of-0000n.safetensors. Every tensor of a folder the reader accepts is then
// read through the folder (safetensors_reads.h).
#include <filesystem>
#include <optional>

#include "fuzz_util.h"
#include "safetensors_reads.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tutti;
  static const std::filesystem::path folder = fuzz::scratch_dir() / "folder";
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  std::vector<std::string_view> parts =
      fuzz::split(std::string_view(reinterpret_cast<const char*>(data), size), fuzz::kFileSeparator);
  if (parts.size() > 6) parts.resize(6);  // an index and up to 5 shards
  auto put = [&](const std::string& name, std::string_view bytes) {
    fuzz::write_bytes((folder / name).string(), bytes.data(), bytes.size());
  };
  if (parts.size() == 1) {
    put("model.safetensors", parts[0]);
  } else {
    put("model.safetensors.index.json", parts[0]);
    const std::size_t n = parts.size() - 1;
    for (std::size_t k = 1; k <= n; ++k) {
      put("model-0000" + std::to_string(k) + "-of-0000" + std::to_string(n) + ".safetensors", parts[k]);
    }
  }
  std::optional<io::SafetensorsFolder> f;
  try {
    f.emplace(folder.string());
  } catch (const InvalidArgument&) {
    return 0;
  }
  for (const std::string& name : f->names()) fuzz::read_everything(*f, f->entry(name));
  return 0;
}
