// The writing half of the checkpoint format (include/tutti/io/checkpoint.h describes the
// bytes), shared by io::save_checkpoint and io::CheckpointWriter, the helpers the reading
// half uses too, and the atomic file writing that safetensors files share. Internal header: not
// installed.
//
// A save is two calls: plan_checkpoint validates the entries and encodes the header (on the
// caller's thread, so that a bad entry throws InvalidArgument before anything is copied or
// written), then write_checkpoint_file writes the header and the tensors' bytes from host
// memory to "<path>.tmp.<pid>", fsyncs, renames over <path> and fsyncs the directory. The
// second may run on another thread (it uses no tensor, only the plan and host pointers).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tutti/io/checkpoint.h"

namespace tutti::io::detail {

inline constexpr char kMagic[8] = {'T', 'U', 'T', 'T', 'I', 'C', 'K', 'P'};
inline constexpr std::size_t kFixedHeaderBytes = 48;
inline constexpr std::size_t kAlign = 64;
inline constexpr std::size_t kTrailerBytes = 4;
inline constexpr std::uint32_t kMaxNdim = 16;

inline std::uint64_t align_up(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// zlib's crc32 over any number of bytes.
std::uint32_t crc_update(std::uint32_t crc, const void* data, std::size_t n);
// The header crc covers [0, 40) and [48, H): everything in the header but its own field.
std::uint32_t header_crc(const unsigned char* header, std::size_t header_size);
// BackendError "<call>('<path>') failed: <strerror(err)>".
[[noreturn]] void throw_errno(const std::string& call, const std::string& path, int err);

// A file descriptor closed on destruction.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd();
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes and reports the error (close can report a delayed write error).
  void close_checked(const std::string& path);

 private:
  int fd_;
};

// What a file will hold, minus the tensors' bytes: the encoded header (offsets, sizes and
// header crc filled in) and where each tensor goes, in the StateDict's (name) order.
struct FilePlan {
  std::vector<unsigned char> header;  // header.size() is H, a multiple of 64
  std::vector<std::uint64_t> offsets;
  std::vector<std::uint64_t> nbytes;
  std::uint64_t file_size = 0;
  std::uint64_t data_bytes() const;  // the tensors' bytes, without padding
};

// Validates `state` and `metadata` (non-empty names and keys, defined tensors of at most
// kMaxNdim dimensions, strings under 4 GiB; `call` names the caller in the message) and
// encodes the header. Reads only names, shapes and dtypes: the tensors may be on any device.
FilePlan plan_checkpoint(const StateDict& state, const Metadata& metadata, const char* call);

// The state's bytes in host memory, in the StateDict's order, for write_checkpoint_file: CPU
// tensors from where they are, GPU ones copied (synchronously, on their device's default
// stream). `tensors` keeps the copies alive while `data` points into them (nullptr for an
// empty tensor).
struct HostData {
  std::vector<Tensor> tensors;
  std::vector<const void*> data;
};
HostData host_data(const StateDict& state);

// Writes the file atomically (header, data[i] for plan.nbytes[i] bytes at plan.offsets[i],
// zero padding, trailer crc), as the format's header describes; data[i] is host memory.
// Throws BackendError naming the call, the file and errno; on failure the temporary is
// removed and `path` is left as it was. Touches no tensor: safe on any thread.
void write_checkpoint_file(const std::string& path, const FilePlan& plan, const std::vector<const void*>& data);

// The same file's bytes in memory (what write_checkpoint_file would write), for a copy that
// goes elsewhere first (train::Run's memory snapshots go to a buddy rank).
std::vector<unsigned char> encode_checkpoint(const FilePlan& plan, const std::vector<const void*>& data);
// Writes `n` bytes to `path` as write_checkpoint_file writes a file: temporary, fsync, atomic
// rename, directory fsync; the same errors.
void write_file_atomically(const std::string& path, const void* bytes, std::size_t n);
// The same with the bytes written by `fill(fd, tmp)` (with write_all) to the temporary file `tmp`
// opened as `fd`, so that a large file is streamed rather than assembled in memory. An exception
// from `fill` removes the temporary and leaves `path` as it was.
void write_file_atomically(const std::string& path, const std::function<void(int fd, const std::string& tmp)>& fill);
// write(2) until all `n` bytes are written (retrying short writes and EINTR); BackendError naming
// `path` otherwise.
void write_all(int fd, const void* data, std::size_t n, const std::string& path);

// The reading half (checkpoint.cc). load_checkpoint_file is io::load_checkpoint; with
// metadata_only it verifies the sizes and the header's crc and returns the metadata alone (no
// tensors, no data read). parse_checkpoint_bytes reads a file's bytes from memory, with every
// check load_checkpoint makes; `name` names them in messages. verify_checkpoint_bytes makes the
// same checks (every checksum included) and returns the metadata alone, without copying the data
// into tensors.
Checkpoint load_checkpoint_file(const std::string& path, bool metadata_only);
Checkpoint parse_checkpoint_bytes(const void* bytes, std::uint64_t size, const std::string& name);
Checkpoint verify_checkpoint_bytes(const void* bytes, std::uint64_t size, const std::string& name);

}  // namespace tutti::io::detail
