// Fuzzes data::read_idx (IDX files, plain or gzip'ed: zlib's gzopen reads both) and the image and
// label readers on top of it. A file it accepts must hold exactly what its header says.
#include <cstdlib>

#include "fuzz_util.h"
#include "tutti/data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tutti;
  const std::string path = fuzz::input_file(data, size, "data.idx");
  try {
    const data::IdxArray a = data::read_idx(path);
    std::size_t count = 1;
    for (std::int64_t d : a.dims) count *= static_cast<std::size_t>(d);
    const std::size_t element = a.type == data::IdxType::u8 || a.type == data::IdxType::i8 ? 1
                                : a.type == data::IdxType::i16                             ? 2
                                : a.type == data::IdxType::f64                             ? 8
                                                                                           : 4;
    if (a.bytes.size() != count * element) std::abort();
    if (a.type == data::IdxType::u8 && a.dims.size() >= 2) {
      if (static_cast<std::size_t>(data::read_idx_images(path).numel()) != count) std::abort();
    }
    if (a.type == data::IdxType::u8 && a.dims.size() == 1) {
      if (static_cast<std::size_t>(data::read_idx_labels(path).numel()) != count) std::abort();
    }
  } catch (const InvalidArgument&) {
  }
  return 0;
}
