// train::Run's memory snapshots (snapshots.h): the parts' files, the buddy exchange, the scan
// of the nodes' memory on a resume and the fetch of every part.
#include "train/snapshots.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "core/format_bytes.h"
#include "io/checkpoint_file.h"
#include "tutti/core/error.h"

namespace tutti::train::detail {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPart = "@part.";
constexpr const char* kSuffix = ".tsnap";

std::uint64_t statvfs_free(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return 0;
  return static_cast<std::uint64_t>(s.f_bavail) * s.f_frsize;
}

std::string mib(std::uint64_t bytes) {
  return tutti::detail::format_bytes(static_cast<double>(bytes), 1, tutti::detail::ByteUnit::MiB,
                                     tutti::detail::ByteUnit::MiB);
}

std::vector<std::int64_t> allgather_ints(Communicator& comm, const std::vector<std::int64_t>& mine, const char* label) {
  const auto n = static_cast<std::int64_t>(mine.size());
  const Tensor in = Tensor::from_ints(mine, {n}, DType::i64);
  const Tensor out = Tensor::empty({n * comm.size()}, DType::i64);
  CallOptions call;
  call.label = label;
  comm.allgather(in, out, call).wait();
  return out.to_ints();
}

std::int64_t allreduce_one(Communicator& comm, std::int64_t v, ReduceOp op, const char* label) {
  const Tensor t = Tensor::from_ints({v}, {1}, DType::i64);
  CallOptions call;
  call.label = label;
  comm.allreduce(t, op, call).wait();
  return t.to_ints()[0];
}

// Every rank's string (problems found in its scan), on every rank.
std::vector<std::string> allgather_strings(Communicator& comm, const std::string& mine) {
  const std::vector<std::int64_t> sizes =
      allgather_ints(comm, {static_cast<std::int64_t>(mine.size())}, "memory snapshot problems");
  std::vector<std::string> out(sizes.size());
  for (int r = 0; r < comm.size(); ++r) {
    const std::int64_t n = sizes[static_cast<std::size_t>(r)];
    if (n == 0) continue;
    Tensor t = Tensor::zeros({(n + 3) / 4}, DType::i32);
    if (r == comm.rank()) std::memcpy(t.data(), mine.data(), static_cast<std::size_t>(n));
    CallOptions call;
    call.label = "memory snapshot problems";
    comm.broadcast(t, r, call).wait();
    out[static_cast<std::size_t>(r)].assign(static_cast<const char*>(t.data()), static_cast<std::size_t>(n));
  }
  return out;
}

// A whole file in one read (a part of a large model's state is hundreds of MB).
std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  TUTTI_CHECK_ARG(in.good(), "cannot open '", path, "'");
  std::vector<unsigned char> bytes(static_cast<std::size_t>(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  TUTTI_CHECK_ARG(in.good() || bytes.empty(), "cannot read '", path, "'");
  return bytes;
}

std::int64_t metadata_int(const io::Checkpoint& c, const std::string& key, const std::string& source) {
  const auto it = c.metadata.find(key);
  TUTTI_CHECK_ARG(it != c.metadata.end(), "memory snapshot '", source, "' has no '", key, "'");
  return std::stoll(it->second);
}

}  // namespace

MemorySnapshots::MemorySnapshots(SnapshotPlace place) : place_(std::move(place)) {
  const int world = place_.world;
  const std::vector<int>& node = place_.node_of_rank;
  TUTTI_CHECK(static_cast<int>(node.size()) == world, "memory snapshots: ", node.size(), " nodes for ", world,
              " ranks");
  if (!place_.free_bytes) place_.free_bytes = statvfs_free;
  dir_ = place_.node_dir + "/tutti-" + place_.run_id;
  const int me = place_.rank;
  node_lowest_ = true;
  node_size_ = 0;
  for (int r = 0; r < world; ++r) {
    if (node[static_cast<std::size_t>(r)] != node[static_cast<std::size_t>(me)]) continue;
    if (r < me) {
      node_lowest_ = false;
      ++node_rank_;
    }
    ++node_size_;
  }
  // Buddies: the ranks ordered by node, each sending to the one m places on (m: the largest
  // node's size), so that no rank's buddy is on its own node while no node holds more than
  // half the ranks.
  std::vector<int> order(static_cast<std::size_t>(world));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return node[static_cast<std::size_t>(a)] < node[static_cast<std::size_t>(b)]; });
  std::map<int, int> node_sizes;
  for (int n : node) ++node_sizes[n];
  int largest = 0;
  for (const auto& [n, size] : node_sizes) largest = std::max(largest, size);
  send_to_all_.assign(static_cast<std::size_t>(world), 0);
  recv_from_all_.assign(static_cast<std::size_t>(world), 0);
  buddies_cover_ = node_sizes.size() > 1;
  for (int pos = 0; pos < world; ++pos) {
    const int r = order[static_cast<std::size_t>(pos)];
    const int to = order[static_cast<std::size_t>((pos + largest) % world)];
    send_to_all_[static_cast<std::size_t>(r)] = to;
    recv_from_all_[static_cast<std::size_t>(to)] = r;
    if (node[static_cast<std::size_t>(to)] == node[static_cast<std::size_t>(r)]) buddies_cover_ = false;
  }
}

std::string MemorySnapshots::file_name(int part, int parts, bool buddy) const {
  return dir_ + "/part-" + std::to_string(part) + "-of-" + std::to_string(parts) + (buddy ? ".buddy" : "") + kSuffix;
}

void MemorySnapshots::keep_as_previous(const std::string& name) {
  // part-<p>-of-<P>[.buddy].tsnap -> part-<p>-of-<P>[.buddy].prev.tsnap, replacing the one before.
  const std::string previous = name.substr(0, name.size() - std::string(kSuffix).size()) + ".prev" + kSuffix;
  std::error_code ignored;  // none yet: the first snapshot
  fs::rename(name, previous, ignored);
}

std::uint64_t MemorySnapshots::check_space(std::uint64_t part_bytes, bool sharded) {
  Communicator& comm = *place_.comm;
  const std::vector<std::int64_t> bytes =
      allgather_ints(comm, {static_cast<std::int64_t>(part_bytes)}, "memory snapshot sizes");
  const bool exchange = sharded && buddies_cover_;
  std::map<int, std::uint64_t> per_node;
  for (int r = 0; r < place_.world; ++r) {
    std::uint64_t b = static_cast<std::uint64_t>(bytes[static_cast<std::size_t>(r)]);
    if (exchange)
      b += static_cast<std::uint64_t>(bytes[static_cast<std::size_t>(recv_from_all_[static_cast<std::size_t>(r)])]);
    per_node[place_.node_of_rank[static_cast<std::size_t>(r)]] += b;
  }
  std::uint64_t largest = 0;
  for (const auto& [n, b] : per_node) largest = std::max(largest, b);
  const std::uint64_t mine = per_node[place_.node_of_rank[static_cast<std::size_t>(place_.rank)]];
  std::error_code ec;
  fs::create_directories(dir_, ec);
  TUTTI_CHECK_ARG(!ec, "memory snapshots: cannot create the folder '", dir_, "': ", ec.message(),
                  " (--snapshot-dir names a node-local folder, /dev/shm by default)");
  // The files there now are replaced by the next snapshot: their space counts as free.
  std::uint64_t replaced = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    std::error_code size_error;
    if (e.is_regular_file(size_error)) replaced += e.file_size(size_error);
  }
  const std::uint64_t free = place_.free_bytes(dir_) + replaced;
  // Every rank refuses alike (a rank left training would wait for the others at its next
  // collective): the lowest rank whose node lacks the space is named everywhere.
  const std::int64_t short_rank =
      allreduce_one(comm, 2 * mine <= free ? place_.world : place_.rank, ReduceOp::min, "memory snapshot space");
  TUTTI_CHECK_ARG(short_rank == place_.world || short_rank == place_.rank, "memory snapshots: rank ", short_rank,
                  "'s node has too little free space in '", dir_, "' (its message says how much); nothing was written");
  // The new file beside the old one: while a write replaces it (stage 0), or kept (ZeRO).
  TUTTI_CHECK_ARG(2 * mine <= free, "memory snapshots need ", mib(2 * mine), " in '", dir_, "' on rank ", place_.rank,
                  "'s node (", mib(mine),
                  " of snapshots, twice: a snapshot is written beside the previous one) but only ", mib(free),
                  " are free: give the node more shared memory (/dev/shm), point --snapshot-dir to a ",
                  "larger node-local folder, or turn them off (--snapshot-every 0). Nothing was written.");
  return largest;
}

void MemorySnapshots::write(const StateDict& encoded, const io::Metadata& metadata, std::int64_t step, bool sharded) {
  const int part = sharded ? place_.rank : 0;
  const int parts = sharded ? place_.world : 1;
  std::vector<unsigned char> image;
  if (writes(sharded)) {
    io::Metadata m = metadata;
    m["snapshot.step"] = std::to_string(step);
    m["snapshot.part"] = std::to_string(part);
    m["snapshot.parts"] = std::to_string(parts);
    m["snapshot.run"] = place_.run_id;
    const io::detail::FilePlan plan = io::detail::plan_checkpoint(encoded, m, "memory snapshot");
    image = io::detail::encode_checkpoint(plan, io::detail::host_data(encoded).data);
    const std::string name = file_name(part, parts, false);
    if (sharded) keep_as_previous(name);
    io::detail::write_file_atomically(name, image.data(), image.size());
  }
  if (sharded && buddies_cover_) {
    // Every rank sends its file to its buddy on another node (a permutation), the size first.
    Communicator& comm = *place_.comm;
    const std::int64_t largest =
        allreduce_one(comm, static_cast<std::int64_t>(image.size()), ReduceOp::max, "memory snapshot size");
    const std::int64_t words = (largest + 8 + 3) / 4;
    const Tensor out = Tensor::zeros({words}, DType::i32);
    const Tensor in = Tensor::empty({words}, DType::i32);
    const auto size = static_cast<std::int64_t>(image.size());
    std::memcpy(out.data(), &size, 8);
    std::memcpy(static_cast<char*>(out.data()) + 8, image.data(), image.size());
    CallOptions call;
    call.label = "memory snapshot to the buddy";
    comm.sendrecv(out, in, send_to_all_[static_cast<std::size_t>(place_.rank)],
                  recv_from_all_[static_cast<std::size_t>(place_.rank)], call)
        .wait();
    std::int64_t got = 0;
    std::memcpy(&got, in.data(), 8);
    TUTTI_CHECK(got >= 0 && got + 8 <= words * 4, "memory snapshot: the buddy's size ", got, " is impossible");
    const int from = recv_from_all_[static_cast<std::size_t>(place_.rank)];
    const std::string name = file_name(from, parts, true);
    keep_as_previous(name);
    io::detail::write_file_atomically(name, static_cast<const char*>(in.data()) + 8, static_cast<std::size_t>(got));
  }
  // Parts of another layout (an earlier world size or stage, before a resume) are stale now
  // that this layout's are written.
  const std::string keep = "-of-" + std::to_string(parts) + ".";
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("part-", 0) == 0 && n.find(keep) == std::string::npos && n.find(".tmp.") == std::string::npos) {
      std::error_code ignored;
      fs::remove(e.path(), ignored);
    }
  }
}

SnapshotFound MemorySnapshots::find() {
  Communicator& comm = *place_.comm;
  // This rank's share of its node's files (the node's ranks split them), verified.
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("part-", 0) == 0 && n.size() > 6 && n.compare(n.size() - 6, 6, kSuffix) == 0) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  std::vector<std::int64_t> records;  // step, part, parts, bytes, buddy
  std::string problems;
  found_bytes_.clear();
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (static_cast<int>(i % static_cast<std::size_t>(node_size_)) != node_rank_) continue;
    const std::string path = dir_ + "/" + names[i];
    try {
      std::vector<unsigned char> bytes = read_bytes(path);
      const io::Checkpoint c = io::detail::verify_checkpoint_bytes(bytes.data(), bytes.size(), path);
      const std::int64_t step = metadata_int(c, "snapshot.step", path);
      const std::int64_t part = metadata_int(c, "snapshot.part", path);
      const std::int64_t parts = metadata_int(c, "snapshot.parts", path);
      const bool buddy = names[i].find(".buddy.") != std::string::npos;
      records.insert(records.end(), {step, part, parts, static_cast<std::int64_t>(bytes.size()), buddy ? 1 : 0});
      found_bytes_[{step, part, parts, buddy}] = std::move(bytes);
    } catch (const std::exception& e) {
      problems += (problems.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  constexpr std::int64_t kFields = 5;
  // Every rank's records padded to the longest (-1: none), at least one record wide.
  const std::int64_t width = std::max<std::int64_t>(
      allreduce_one(comm, static_cast<std::int64_t>(records.size()), ReduceOp::max, "memory snapshot scan"), kFields);
  records.resize(static_cast<std::size_t>(width), -1);
  const std::vector<std::int64_t> all = allgather_ints(comm, records, "memory snapshot scan");

  SnapshotFound found;
  for (const std::string& p : allgather_strings(comm, problems)) {
    if (!p.empty()) found.problems += (found.problems.empty() ? "" : "; ") + p;
  }
  // (step, parts) -> part -> (holder, buddy, bytes): the lowest rank, its own copy first.
  std::map<std::pair<std::int64_t, std::int64_t>, std::map<std::int64_t, std::tuple<int, bool, std::int64_t>>> sets;
  for (int r = 0; r < place_.world; ++r) {
    for (std::int64_t k = 0; k + kFields <= width; k += kFields) {
      const std::int64_t* f = &all[static_cast<std::size_t>(r * width + k)];
      if (f[0] < 0) continue;
      found.newest_seen = std::max(found.newest_seen, f[0]);
      auto& parts = sets[{f[0], f[2]}];
      const auto it = parts.find(f[1]);
      const bool buddy = f[4] != 0;
      if (it == parts.end() || (std::get<1>(it->second) && !buddy)) parts[f[1]] = {r, buddy, f[3]};
    }
  }
  for (auto it = sets.rbegin(); it != sets.rend(); ++it) {
    const auto [step, parts] = it->first;
    if (static_cast<std::int64_t>(it->second.size()) != parts) continue;
    found.step = step;
    found.parts = static_cast<int>(parts);
    for (const auto& [part, holder] : it->second) {
      found.holder.push_back(std::get<0>(holder));
      found.from_buddy.push_back(std::get<1>(holder));
      found.bytes.push_back(std::get<2>(holder));
    }
    break;
  }
  return found;
}

io::Checkpoint MemorySnapshots::fetch(const SnapshotFound& found) {
  Communicator& comm = *place_.comm;
  std::vector<StateDict> parts;
  io::Metadata metadata;
  for (int p = 0; p < found.parts; ++p) {
    const std::int64_t size = found.bytes[static_cast<std::size_t>(p)];
    const int holder = found.holder[static_cast<std::size_t>(p)];
    Tensor t = Tensor::zeros({(size + 3) / 4}, DType::i32);
    if (holder == place_.rank) {
      const auto it = found_bytes_.find({found.step, p, found.parts, found.from_buddy[static_cast<std::size_t>(p)]});
      TUTTI_CHECK(it != found_bytes_.end() && static_cast<std::int64_t>(it->second.size()) == size,
                  "memory snapshots: part ", p, " of step ", found.step, " is not held here");
      std::memcpy(t.data(), it->second.data(), it->second.size());
    }
    CallOptions call;
    call.label = "memory snapshot fetch";
    comm.broadcast(t, holder, call).wait();
    const std::string name = file_name(p, found.parts, found.from_buddy[static_cast<std::size_t>(p)]) + " (on rank " +
                             std::to_string(holder) + "'s node)";
    io::Checkpoint c = io::detail::parse_checkpoint_bytes(t.data(), static_cast<std::uint64_t>(size), name);
    if (p == 0) metadata = c.metadata;
    parts.push_back(std::move(c.state));
  }
  found_bytes_.clear();
  io::Checkpoint out;
  out.state = assemble(parts, dir_);
  for (const auto& [k, v] : metadata) {
    if (k.rfind("snapshot.", 0) != 0) out.metadata[k] = v;
  }
  return out;
}

void MemorySnapshots::remove_folder() noexcept {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

StateDict MemorySnapshots::encode(const std::map<std::string, Piece>& pieces) {
  StateDict out;
  for (const auto& [key, p] : pieces) {
    out[key] = p.part;
    std::vector<std::int64_t> range{p.begin, static_cast<std::int64_t>(p.shape.size())};
    range.insert(range.end(), p.shape.begin(), p.shape.end());
    out[kPart + key] = Tensor::from_ints(range, {static_cast<std::int64_t>(range.size())}, DType::i64);
  }
  return out;
}

StateDict MemorySnapshots::assemble(const std::vector<StateDict>& parts, const std::string& source) {
  struct Span {
    std::int64_t begin;
    Tensor part;
  };
  std::map<std::string, std::pair<Shape, std::vector<Span>>> pieces;
  for (const StateDict& part : parts) {
    for (const auto& [key, t] : part) {
      if (key.rfind(kPart, 0) == 0) continue;
      const std::vector<std::int64_t> range = get_tensor(part, kPart + key).to_ints();
      TUTTI_CHECK_ARG(range.size() >= 2 && static_cast<std::int64_t>(range.size()) == 2 + range[1],
                      "memory snapshot in '", source, "' is corrupt: the range of '", key, "'");
      const Shape shape(range.begin() + 2, range.end());
      auto& [whole_shape, spans] = pieces[key];
      if (spans.empty()) whole_shape = shape;
      TUTTI_CHECK_ARG(whole_shape == shape, "memory snapshot in '", source, "': the parts disagree on the shape of '",
                      key, "'");
      spans.push_back({range[0], t});
    }
  }
  StateDict out;
  for (auto& [key, entry] : pieces) {
    auto& [shape, spans] = entry;
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
    Tensor whole = Tensor::empty(shape, spans.front().part.dtype());
    std::int64_t covered = 0;
    for (const Span& s : spans) {
      if (s.begin < covered && s.begin + s.part.numel() <= covered)
        continue;  // the same elements again (whole entries)
      TUTTI_CHECK_ARG(s.begin == covered, "memory snapshot in '", source, "' lacks elements [", covered, ", ", s.begin,
                      ") of '", key, "' (or gives some twice)");
      whole.view(covered, {s.part.numel()}).copy_from(s.part);
      covered += s.part.numel();
    }
    TUTTI_CHECK_ARG(covered == whole.numel(), "memory snapshot in '", source, "' lacks elements [", covered, ", ",
                    whole.numel(), ") of '", key, "'");
    out[key] = whole;
  }
  return out;
}

}  // namespace tutti::train::detail
