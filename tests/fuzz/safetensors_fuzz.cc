// Fuzzes io::SafetensorsFile: the header's checks, then every read of every tensor of a file it
// accepts (safetensors_reads.h), then the writer: a file whose tensors tutti holds is written
// again with save_safetensors and must read back bit for bit, with its metadata.
#include <cstdlib>
#include <optional>

#include "fuzz_util.h"
#include "safetensors_reads.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tutti;
  const std::string path = fuzz::input_file(data, size, "model.safetensors");
  std::optional<io::SafetensorsFile> file;
  try {
    file.emplace(path);
  } catch (const InvalidArgument&) {
    return 0;
  }
  bool writable = true;
  for (const io::SafetensorsEntry& e : file->entries()) {
    fuzz::read_everything(*file, e);
    writable = writable && e.tutti_dtype.has_value() && !e.name.empty();  // the writer refuses empty names
  }
  if (!writable) return 0;
  io::NamedTensors tensors;
  for (const io::SafetensorsEntry& e : file->entries()) tensors.emplace_back(e.name, file->read(e.name));
  const std::string again = (fuzz::scratch_dir() / "again.safetensors").string();
  io::save_safetensors(again, tensors, file->metadata());
  const io::SafetensorsFile back(again);
  if (back.metadata() != file->metadata() || back.entries().size() != tensors.size()) std::abort();
  for (const auto& [name, t] : tensors) {
    const Tensor u = back.read(name);
    if (u.shape() != t.shape() || u.dtype() != t.dtype() ||
        (t.nbytes() > 0 && std::memcmp(u.data(), t.data(), t.nbytes()) != 0)) {
      std::abort();
    }
  }
  return 0;
}
