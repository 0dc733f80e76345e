// train::Run's memory snapshots (RunOptions::snapshots.every): every K steps each rank's part of
// the training state goes to a file in its node's memory (/dev/shm), which outlives the
// process but not the node, and, under ZeRO, to a buddy rank on another node; a resume takes
// the newest snapshot whose parts the surviving nodes hold between them. Internal header.
//
// The parts. Under ZeRO every rank writes its part (DistributedDataParallel::*_state_parts: its
// shard's elements of each tensor, and the small entries whole): part r of W. At stage 0 every
// rank holds everything, so the lowest rank of each node writes the whole state: part 0 of 1,
// one copy per node, and no buddy is needed (every other node has its own copy).
//
// A snapshot file is a checkpoint file (io/checkpoint.h: checksums, atomic rename) holding,
// for each entry "k" of the state (the keys of Run's checkpoint file), its part as a 1-D tensor
// under "k" and "@part.k": i64 [begin, ndim, dims...] (where the part starts in the flattened
// whole, and the whole's shape); metadata "snapshot.step", "snapshot.part", "snapshot.parts"
// and "snapshot.run" besides the Run's own. Names: <dir>/part-<p>-of-<P>.tsnap, and the buddy's
// copy part-<p>-of-<P>.buddy.tsnap on the buddy's node. Under ZeRO a write first renames the
// last one to part-<p>-of-<P>[.buddy].prev.tsnap (replacing the one before): a node lost while
// a snapshot is being written (some ranks' parts written, its buddy's copy of its part not)
// leaves the previous snapshot whole, where keeping only the newest files would leave none.
// At stage 0 every node's file is whole: each write replaces the last.
//
// The folder: <node dir>/tutti-<run id>, the run id being a random number kept in
// <checkpoint dir>/run-id (written when a run starts afresh), so that a snapshot is only ever
// taken by the run that wrote it, and a new run (or a deleted checkpoint folder) never
// resumes from an older run's memory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/core/state_dict.h"
#include "tutti/io/checkpoint.h"

namespace tutti::train::detail {

struct SnapshotPlace {
  Communicator* comm = nullptr;  // CPU tensors: inventories, the buddy exchange, the fetch
  int rank = 0, world = 1;
  std::vector<int> node_of_rank;  // per rank: its node (any integers; equal: same node)
  std::string node_dir;           // this rank's node's folder (/dev/shm): the run's sub-folder goes in it
  std::string run_id;
  // Free bytes of a folder (default: statvfs).
  std::function<std::uint64_t(const std::string&)> free_bytes;
};

// What find() saw in the nodes' memory.
struct SnapshotFound {
  std::int64_t step = -1;           // the newest complete snapshot's step (-1: none)
  int parts = 0;                    // its parts
  std::int64_t newest_seen = -1;    // the newest step of any snapshot part found, complete or not
  std::vector<int> holder;          // per part: the rank that holds it (lowest)
  std::vector<bool> from_buddy;     // per part: the holder's copy is a buddy's
  std::vector<std::int64_t> bytes;  // per part
  std::string problems;             // corrupt or unreadable files, "; "-separated ("" when none)
};

class MemorySnapshots {
 public:
  explicit MemorySnapshots(SnapshotPlace place);

  const std::string& dir() const { return dir_; }
  // Whether this rank writes a part (ZeRO: every rank; stage 0: the lowest rank of its node).
  bool writes(bool sharded) const { return sharded || node_lowest_; }
  // Whether every part's buddy is on another node (false with one node, or a node holding
  // more than half the ranks).
  bool buddies_cover_nodes() const { return buddies_cover_; }

  // COLLECTIVE: the bytes each node will hold (its writers' parts and the buddy copies, twice
  // while a write replaces the last), from each rank's part size (0 when it writes none);
  // refuses (InvalidArgument naming the folder, the bytes needed and free) when this rank's
  // node has too little free space. Returns the largest node's bytes.
  std::uint64_t check_space(std::uint64_t part_bytes, bool sharded);
  // COLLECTIVE: writes this rank's part (`state`, encoded as above, with `metadata`) and, under
  // ZeRO, exchanges parts with the buddies. Throws what a write threw (naming the file).
  void write(const StateDict& encoded, const io::Metadata& metadata, std::int64_t step, bool sharded);
  // COLLECTIVE: the newest snapshot whose every part some rank holds (files that do not verify
  // are named in problems and not used; files of another run are not in the folder).
  SnapshotFound find();
  // COLLECTIVE: every part of `found` on every rank (each holder broadcasts its file's bytes),
  // assembled into whole tensors under the checkpoint's keys, with the writer's metadata.
  io::Checkpoint fetch(const SnapshotFound& found);
  // Not collective: removes the run's folder on this rank's node, once no rank writes there
  // any more (the run ended). Never throws.
  void remove_folder() noexcept;

  // The encoded form of a part (above) from parts of whole tensors under their keys.
  struct Piece {
    Tensor part;  // 1-D
    std::int64_t begin = 0;
    Shape shape;
  };
  static StateDict encode(const std::map<std::string, Piece>& pieces);
  // Whole tensors (CPU) from several parts' encoded forms; `source` names them in errors
  // (InvalidArgument: an element missing or given twice differently).
  static StateDict assemble(const std::vector<StateDict>& parts, const std::string& source);

 private:
  std::string file_name(int part, int parts, bool buddy) const;
  // Renames the file `name` (if there) to its ".prev" name, replacing the previous one.
  static void keep_as_previous(const std::string& name);

  SnapshotPlace place_;
  std::string dir_;
  bool node_lowest_ = false;
  std::vector<int> send_to_all_, recv_from_all_;  // per rank: the buddy exchange
  bool buddies_cover_ = false;
  int node_rank_ = 0, node_size_ = 1;  // this rank among its node's, for sharing the scan
  // find(): the bytes of the files this rank verified, by (step, part, parts, buddy's copy).
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, bool>, std::vector<unsigned char>> found_bytes_;
};

// RunOptions::snapshots.every = kSnapshotAuto: the interval K in steps (1 to 1e9), from the first
// snapshot's seconds and a step's. Without an MTBF (0), the least K for which the snapshots take
// at most `cost` of the time; with one, Young and Daly's optimum sqrt(2 x snapshot x MTBF),
// rounded to steps: the snapshots' cost against the work that a failure, on average half an
// interval after a snapshot, takes back.
std::int64_t auto_snapshot_interval(double snapshot_seconds, double step_seconds, double cost, double mtbf);

}  // namespace tutti::train::detail
