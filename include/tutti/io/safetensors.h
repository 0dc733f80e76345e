// safetensors: Hugging Face's format for model weights. Reading a file or a folder of shards
// tensor by tensor (or a range of a tensor's elements), and writing both, as Hugging Face's
// libraries write them, so that a model trained elsewhere can be loaded and one trained here
// handed back.
//
// File format (all of it little-endian):
//
//   offset 0   u64   header length N
//          8   N bytes of UTF-8 JSON, possibly padded with trailing spaces:
//                {"__metadata__": {"format": "pt", ...},               (optional; strings only)
//                 "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//                 ...}
//          8+N the data buffer: every tensor's bytes, row-major, packed without holes; offsets
//              are relative to the buffer's start, and the last tensor ends at the file's end.
//
// Dtypes: tutti holds F32, F16, BF16, I32 and I64 (DType f32, f16, bf16, i32, i64). Files with
// the format's other dtypes (F64, U8, BOOL, F8_E4M3, ...) open and list, and reading such a
// tensor throws InvalidArgument naming the file, the tensor and its dtype.
//
// Untrusted input. Opening a file reads its 8-byte length and its header only, and checks
// everything before returning: a file shorter than 8 bytes, a header length past the end of the
// file or above kSafetensorsMaxHeaderBytes (refused before the header is allocated), a header
// that is not JSON, not an object or nested deeper than the format, a duplicate key (so a
// duplicate tensor name), an entry that is not an object, a missing field, an unknown dtype, a
// shape that is not a list of non-negative integers or whose element count overflows,
// data_offsets that are not two non-negative integers, are reversed, run past the end of the
// file, overlap another tensor's or disagree with dtype x shape, bytes of the buffer that no
// tensor covers (the format forbids holes), and metadata that is not string -> string. Each
// throws tutti::InvalidArgument naming the file and, where there is one, the tensor, e.g.
// "safetensors file 'w.safetensors': tensor 'fc.weight' (F32 [4, 3]) needs 48 bytes but its
// data_offsets [0, 40) hold 40". Reads allocate at most what the file holds (twice that when
// converting f16 or bf16 to f32). Failures of the operating system throw tutti::BackendError
// naming the call, the file and errno.
//
// Nothing here is collective. Readers are safe to use from several threads at once (reads are
// pread()s at explicit offsets); writers are not shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tutti/core/state_dict.h"
#include "tutti/core/tensor.h"
#include "tutti/io/checkpoint.h"  // io::Metadata

namespace tutti::io {

// The largest header a file may declare, as Hugging Face's reader (100 MB): a larger length is
// refused before anything is allocated.
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Tensors to write, in the caller's order (names must be unique).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// One tensor of a file, as its header describes it.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;                 // as the file spells it: "F32", "BF16", "F64", "U8", ...
  std::optional<DType> tutti_dtype;  // the DType tutti reads it as; empty for the dtypes tutti does not hold
  Shape shape;                       // [] for a 0-d tensor
  std::uint64_t begin = 0, end = 0;  // its bytes [begin, end) in the data buffer
  std::int64_t numel() const;        // product of shape (1 for a 0-d tensor)
  std::uint64_t nbytes() const { return end - begin; }
};

// An open safetensors file: the header parsed and validated (see above), the data left on disk
// until a tensor is read. Holds the file open (one descriptor) until destroyed; movable.
class SafetensorsFile {
 public:
  // Opens `path`, reads and validates its header (not the data). Throws InvalidArgument for a
  // missing or damaged file, naming it.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Every tensor, in the order of their bytes in the buffer.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // The tensor named `name`; InvalidArgument naming the file and the name when there is none.
  const SafetensorsEntry& entry(const std::string& name) const;
  // The header's "__metadata__" (empty when it has none).
  const Metadata& metadata() const { return metadata_; }
  // Where the data buffer starts in the file: 8 + the header length.
  std::uint64_t data_start() const { return data_start_; }

  // The whole tensor as a new CPU tensor of its shape, in its own dtype or converted to `as`.
  // Conversions: between f32, f16 and bf16 (rounding to nearest even); an integer tensor is
  // read as it is stored (asking for another dtype throws InvalidArgument).
  Tensor read(const std::string& name, std::optional<DType> as = std::nullopt) const;
  // Elements [first, first + count) of the tensor in row-major order, as a new 1-D CPU tensor
  // [count]: a caller loads its slice of a large tensor without holding the whole. Throws
  // InvalidArgument (before allocating) unless 0 <= first and first + count <= numel.
  Tensor read_elements(const std::string& name, std::int64_t first, std::int64_t count,
                       std::optional<DType> as = std::nullopt) const;
  // The same into a CPU tensor the caller owns (a view into a larger buffer is fine): reads
  // out.numel() elements from `first`, converted to out.dtype() as read() converts.
  void read_elements_into(const std::string& name, std::int64_t first, const Tensor& out) const;
  // Every tensor, read(), by name. Throws for a dtype tutti does not hold.
  StateDict read_all(std::optional<DType> as = std::nullopt) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::unordered_map<std::string, std::size_t> index_;  // name -> position in entries_
  Metadata metadata_;
};

// Writes `tensors` and `metadata` (the header's "__metadata__", omitted when empty) to `path`
// atomically, as checkpoints are (io/checkpoint.h: a temporary file, fsync, rename over
// `path`, fsync of the directory; a failed save leaves `path` as it was). The header is compact
// JSON ("__metadata__" first, then the tensors in buffer order) padded with spaces to a multiple
// of 8 bytes, as Hugging Face's writer pads it; the buffer holds the tensors ordered by element
// size, largest first (stable: otherwise in the given order), so that every tensor starts at a
// multiple of its element size in the file. GPU tensors are copied to the host one at a time
// (synchronously, on their device's default stream). Names must be non-empty, unique and not
// "__metadata__", tensors defined, strings valid UTF-8: else InvalidArgument before any file is
// touched. Blocks until the data is on disk.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});

// Folders as Hugging Face writes them (save_pretrained): either one file "<prefix>.safetensors",
// or shards "<prefix>-00001-of-00003.safetensors", ... and an index
// "<prefix>.safetensors.index.json": {"metadata": {"total_size": <bytes of tensor data>},
// "weight_map": {"<tensor name>": "<shard file name>", ...}}.
struct SafetensorsFolderOptions {
  // A shard holds at most this many bytes of tensor data, except a tensor larger than it, which
  // gets a shard of its own (Hugging Face's default "5GB" is 5 * 10^9 bytes).
  std::uint64_t max_shard_bytes = 5'000'000'000;
  // The files' name before ".safetensors" ("model" for models; "diffusion_pytorch_model" ...).
  std::string prefix = "model";
};

// Writes `tensors` into the folder `dir` (created when missing), cut into shards by Hugging
// Face's rule (huggingface_hub's split_state_dict_into_shards): in the given order, a new shard
// starts when the next tensor would take the current one past max_shard_bytes; a tensor larger
// than that gets a shard of its own where it comes, and the shard being filled goes on after it.
// One shard is written as "<prefix>.safetensors" with no index; several as numbered shards and
// then the index (pretty-printed, keys sorted, as Hugging Face writes it). Every shard carries
// `metadata` (transformers' from_pretrained wants {"format": "pt"}). Each file is written
// atomically (save_safetensors), the index last; the folder as a whole is not (write to a new
// folder when a reader must never see a mix). Files of this prefix that the other layout or
// another shard count left are removed afterwards, so that a reader finds only this model.
// Returns the names of the files written, shards first. Checks every name (duplicates across
// shards too) before anything is written.
std::vector<std::string> save_safetensors_folder(const std::string& dir, const NamedTensors& tensors,
                                                 const Metadata& metadata = {},
                                                 const SafetensorsFolderOptions& options = {});

// A folder of safetensors files as save_safetensors_folder (or Hugging Face) writes it, opened
// once: "<prefix>.safetensors" when it exists (as transformers looks first), else the index and
// every shard it names, each opened once and validated at construction. Throws InvalidArgument
// naming the folder when it holds neither; and naming the index, the shard and the tensor when
// the index is not such JSON (an object whose "weight_map" maps names to file names in the
// folder), names a shard that does not exist, maps a tensor to a shard that does not hold it, or
// when a shard holds a tensor that the index maps elsewhere or does not list.
class SafetensorsFolder {
 public:
  explicit SafetensorsFolder(const std::string& dir, const std::string& prefix = "model");

  const std::string& dir() const { return dir_; }
  // The open files: the one file, or the shards in name order.
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // Every tensor's name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The file that holds `name` and its entry there; InvalidArgument naming the folder and the
  // name when no file does.
  const SafetensorsFile& file_of(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const { return file_of(name).entry(name); }

  // SafetensorsFile's reads, from the file that holds the tensor.
  Tensor read(const std::string& name, std::optional<DType> as = std::nullopt) const;
  Tensor read_elements(const std::string& name, std::int64_t first, std::int64_t count,
                       std::optional<DType> as = std::nullopt) const;
  void read_elements_into(const std::string& name, std::int64_t first, const Tensor& out) const;
  StateDict read_all(std::optional<DType> as = std::nullopt) const;

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, std::size_t> where_;  // name -> position in files_
};

}  // namespace tutti::io
