// Checkpoints: a StateDict and a few strings of metadata in one file, written atomically and
// verified on reading.
//
// File format, version 1 (all integers little-endian; tensors in the host's byte order,
// which must be little-endian):
//
//   offset  0  char[8]  magic "TUTTICKP"
//           8  u32      format version (kCheckpointFormatVersion)
//          12  u32      number of metadata entries M
//          16  u32      number of tensor entries T
//          20  u32      0 (reserved)
//          24  u64      header size H: bytes from offset 0 to the first tensor's data
//          32  u64      file size, including the 4-byte trailer
//          40  u32      header crc: zlib crc32 of bytes [0, 40) then [48, H), so a damaged
//                       size field or entry table is named as such before it is used
//          44  u32      0 (reserved)
//          48  M x { u32 key length, key bytes, u32 value length, value bytes }
//              T x { u32 name length, name bytes, u8 dtype (DType's value), u8 ndim,
//                    u16 0, i64 dims[ndim], u64 data offset, u64 data bytes }
//              zero padding to H (a multiple of 64)
//           H  tensor data in entry order, each at its offset (64-byte aligned, zero padding
//              between)
//   size-4     u32      zlib crc32 of every byte before it
//
// Writing (save_checkpoint) goes to "<path>.tmp.<pid>", which is flushed and fsync'ed, then
// renamed over <path>, and the directory is fsync'ed. rename() is atomic: at every moment,
// and after a crash or power loss at any point, <path> is either the previous complete file
// or the new complete file, never a mix. A failed save removes its temporary file and leaves
// <path> as it was. A temporary file left by a process that was killed during a save is
// never read, and the next save to the same path removes it (every regular file named
// "<path>.tmp.<digits>") before it writes its own: a path has one writer at a time (rank 0
// of one job), so no other process can still be writing one. A temporary that cannot be
// removed is left for the save after.
//
// Reading (load_checkpoint) checks the magic, the version, the header's crc, the file's size
// against the header, every entry's bounds, and the crc of the whole file (streamed, one
// read, straight into the tensors), and throws tutti::InvalidArgument naming the file and
// what is wrong ("is truncated at byte 1000 of 4096", "unsupported format version 2",
// "checksum mismatch: stored 0x1234abcd != computed 0x..."), before returning anything.
// I/O failures of the operating system throw tutti::BackendError naming the call and errno.
//
// io::CheckpointWriter (tutti/io/checkpoint_writer.h) writes the same files from a background
// thread, so that training stalls only for a copy of the state to host memory.
//
// Neither function is collective: in a data-parallel job rank 0 saves (every rank holds the
// same model), and every rank loads the same file.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "tutti/core/state_dict.h"

namespace tutti::io {

inline constexpr std::uint32_t kCheckpointFormatVersion = 1;

// Free-form strings stored beside the tensors (the model's name and fingerprint, the
// program's flags...).
using Metadata = std::map<std::string, std::string>;

struct Checkpoint {
  StateDict state;  // CPU tensors
  Metadata metadata;
};

// Writes `state` (tensors on any device; GPU tensors are copied to the host first,
// synchronously) and `metadata` to `path` atomically as described above. Names must be
// non-empty and every tensor defined (else InvalidArgument, before any file is touched).
// Blocks until the data is on disk (fsync).
void save_checkpoint(const std::string& path, const StateDict& state, const Metadata& metadata = {});

// Reads and verifies a file written by save_checkpoint. The tensors are bit-identical to the
// ones saved, with the same names, shapes and dtypes, on the CPU.
Checkpoint load_checkpoint(const std::string& path);

// Checks that `loaded` has exactly the entries of `expected`, with the same shapes and
// dtypes (the values are not compared), and throws InvalidArgument otherwise, e.g.
// "checkpoint 'ckpt.bin' is for another model: parameter 'fc1.weight' has shape [512, 784]
// in the checkpoint but [256, 784] here". `source` names the checkpoint in the message.
// Only keys under `prefix` are compared (all when empty), so one checkpoint may hold the
// model ("model."), the optimizer ("optim.") and more, each checked on its own.
void check_state_matches(const StateDict& loaded, const StateDict& expected, const std::string& source,
                         const std::string& prefix = "");

// One checkpoint holds several state dicts under prefixes ("model.", "optim.", "scaler.",
// "loader."). add_prefixed copies every entry of `part` into `into` as prefix + name (a
// handle copy, no data copy) and throws InvalidArgument if a name is already there;
// strip_prefix returns the entries of `state` whose names start with `prefix`, without it.
void add_prefixed(StateDict& into, const std::string& prefix, const StateDict& part);
StateDict strip_prefix(const StateDict& state, const std::string& prefix);

// Throws InvalidArgument unless metadata[key] == expected, e.g. "checkpoint 'ckpt.bin' is for
// another model: model is 'mlp-784-512-256-10' in the checkpoint but 'cnn' here" (or "...has
// no 'model'").
void check_metadata(const Checkpoint& checkpoint, const std::string& key, const std::string& expected,
                    const std::string& source);

}  // namespace tutti::io
