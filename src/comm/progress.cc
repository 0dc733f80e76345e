// The progress board (see progress.h): a file of one slot per rank, mapped by every rank of a
// host.
#include "comm/progress.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "tutti/core/error.h"

namespace tutti::detail {
namespace {

constexpr char kMagic[8] = {'T', 'U', 'T', 'T', 'I', 'P', 'B', '1'};

// Plain integers in the shared mapping, always accessed through std::atomic_ref.
struct CommSlot {
  std::uint64_t issued, started, completed;
  std::int64_t started_ns;
  std::uint32_t version;  // odd while the description below is being written
  std::uint32_t pad;
  std::uint64_t info_seq;
  std::int64_t count;
  std::int32_t kind, op, dtype, root;
  char label[kBoardLabel];
};

struct Header {
  char magic[8];
  std::uint32_t size;
  std::uint32_t slot_bytes;
  char pad[48];
};
static_assert(sizeof(Header) == 64);

template <typename T>
T load(const T& x) {
  return std::atomic_ref<T>(const_cast<T&>(x)).load(std::memory_order_acquire);
}
template <typename T>
void store(T& x, T v) {
  std::atomic_ref<T>(x).store(v, std::memory_order_release);
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

bool is_dir(const char* path) {
  struct stat st {};
  return path != nullptr && ::stat(path, &st) == 0 && S_ISDIR(st.st_mode) && ::access(path, W_OK | X_OK) == 0;
}

std::string scratch_dir() { return is_dir("/dev/shm") ? "/dev/shm" : "/tmp"; }

// Characters safe in a file name.
std::string sanitize(std::string s) {
  for (char& c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) c = '_';
  }
  return s;
}

bool private_board() {
  const char* v = env("TUTTI_PROGRESS_BOARD");
  return v != nullptr && std::string(v) == "private";
}

// What /proc says of a process of this host: stopped, gone.
void process_state(std::uint32_t pid, bool& stopped, bool& gone) {
  stopped = gone = false;
  if (pid == 0) return;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
    gone = true;
    return;
  }
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return;
  const auto paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return;
  const char state = line[paren + 2];
  stopped = state == 'T' || state == 't';
  gone = state == 'Z' || state == 'X';
}

}  // namespace

struct ProgressBoard::Slot {
  std::uint32_t pid;
  std::uint32_t phase;
  std::int64_t phase_ns;
  char pad[48];
  CommSlot comm[kBoardComms];
};

const char* name_of(Phase phase) {
  switch (phase) {
    case Phase::absent: return "no sign of it";
    case Phase::starting: return "starting its Job (before MPI_Init)";
    case Phase::mpi_init: return "in MPI_Init";
    case Phase::bootstrap: return "setting up its communicators";
    case Phase::running: return "running";
    case Phase::leaving: return "leaving the job (failed)";
    case Phase::left:
      return "past its Job (an error every rank raised), not yet at MPI_Finalize (its program's catch block runs "
             "first)";
    case Phase::finalizing: return "in MPI_Finalize";
    case Phase::finished: return "finished";
  }
  return "?";
}

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string CommSnapshot::describe() const {
  if (info_seq == 0) return "none";
  if (kind < 0 || kind > static_cast<int>(CollectiveKind::sendrecv) || dtype < 0 ||
      dtype > static_cast<int>(DType::i64) || op < 0 || op > static_cast<int>(ReduceOp::min)) {
    std::string out = "#";  // (appended, not '"#" + ...': GCC 12 warns falsely on that)
    out += std::to_string(info_seq);
    out += " (unreadable)";
    return out;
  }
  CollectiveInfo info;
  info.seq = info_seq;
  info.kind = static_cast<CollectiveKind>(kind);
  info.op = static_cast<ReduceOp>(op);
  info.dtype = static_cast<DType>(dtype);
  info.count = count;
  info.root = root;
  info.label = std::string(label, strnlen(label, sizeof label));
  return info.str();
}

ProgressBoard::ProgressBoard(std::string path, void* map, std::size_t bytes, int rank, int size, bool private_only)
    : path_(std::move(path)), map_(map), bytes_(bytes), rank_(rank), size_(size), private_only_(private_only) {
  Slot* mine = slot(rank_);
  if (mine == nullptr) return;
  // Clear what an earlier job with the same name may have left, then say who we are.
  store(mine->phase, static_cast<std::uint32_t>(Phase::absent));
  for (auto& c : mine->comm) {
    store(c.issued, std::uint64_t{0});
    store(c.started, std::uint64_t{0});
    store(c.completed, std::uint64_t{0});
    store(c.info_seq, std::uint64_t{0});
  }
  store(mine->pid, static_cast<std::uint32_t>(::getpid()));
}

ProgressBoard::~ProgressBoard() {
  if (map_ != nullptr) ::munmap(map_, bytes_);
}

std::unique_ptr<ProgressBoard> ProgressBoard::open_file(const std::string& path, int rank, int size) {
  if (rank < 0 || size <= 0 || rank >= size) return nullptr;
  const std::size_t bytes = sizeof(Header) + static_cast<std::size_t>(size) * sizeof(Slot);
  if (private_board()) {
    // Each rank sees only itself, as if every rank were on a host of its own (tests).
    void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return nullptr;
    return std::unique_ptr<ProgressBoard>(new ProgressBoard("", map, bytes, rank, size, true));
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  // Every rank of the host sets the same size; a file of another size is of another job.
  struct stat st {};
  if (::fstat(fd, &st) != 0 ||
      (static_cast<std::size_t>(st.st_size) != bytes && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0)) {
    ::close(fd);
    return nullptr;
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return nullptr;
  auto* header = static_cast<Header*>(map);
  std::memcpy(header->magic, kMagic, sizeof kMagic);
  store(header->size, static_cast<std::uint32_t>(size));
  store(header->slot_bytes, static_cast<std::uint32_t>(sizeof(Slot)));
  return std::unique_ptr<ProgressBoard>(new ProgressBoard(path, map, bytes, rank, size, false));
}

std::unique_ptr<ProgressBoard> ProgressBoard::open_from_launcher() {
  int rank = -1, size = 0;
  std::string path;
  if (const char* r = env("OMPI_COMM_WORLD_RANK"), *n = env("OMPI_COMM_WORLD_SIZE"),
      *job = env("OMPI_MCA_ess_base_jobid");
      r && n && job) {
    // Open MPI's mpirun: the job family's session directory, which mpirun removes at the end.
    const char* session = env("OMPI_MCA_orte_jobfam_session_dir");
    path = (is_dir(session) ? std::string(session) : scratch_dir()) + "/tutti-progress-" + sanitize(job);
    rank = std::atoi(r);
    size = std::atoi(n);
  } else if (const char* r = env("SLURM_PROCID"), *n = env("SLURM_STEP_NUM_TASKS"), *job = env("SLURM_JOB_ID"),
             *step = env("SLURM_STEP_ID");
             r && n && job && step) {
    path = scratch_dir() + "/tutti-progress-slurm-" + sanitize(job) + "." + sanitize(step);
    rank = std::atoi(r);
    size = std::atoi(n);
  } else {
    return nullptr;
  }
  if (size <= 1) return nullptr;
  return open_file(path, rank, size);
}

std::shared_ptr<ProgressBoard> ProgressBoard::open_after_init(std::shared_ptr<ProgressBoard> existing, Bootstrap& local,
                                                              int world_rank, int world_size) {
  if (world_size <= 1) return nullptr;
  const int local_rank = local.rank();
  // The launcher's names are only trusted when every rank of the host opened the same one.
  const bool usable = existing && existing->rank() == world_rank && existing->size() == world_size;
  bool all_usable = true;
  for (const std::string& v : local.allgather(usable ? "1" : "0")) all_usable = all_usable && v == "1";
  std::shared_ptr<ProgressBoard> board;
  if (all_usable) {
    board = std::move(existing);
  } else {
    existing.reset();
    // Named by local rank 0, after its pid and the time.
    char name[256] = {0};
    if (local_rank == 0) {
      std::snprintf(name, sizeof name, "%s/tutti-progress-%d-%lld", scratch_dir().c_str(), static_cast<int>(::getpid()),
                    static_cast<long long>(monotonic_ns()));
    }
    board = open_file(local.broadcast(name, 0), world_rank, world_size);
  }
  // Every rank of the host has mapped it: nobody needs the name any more.
  local.barrier();
  if (board && local_rank == 0) board->unlink_file();
  return board;
}

std::vector<std::shared_ptr<ProgressBoard>> ProgressBoard::open_in_process(int size) {
  char name[256] = {0};
  static std::atomic<int> groups{0};
  std::snprintf(name, sizeof name, "%s/tutti-progress-%d-threads-%d-%lld", scratch_dir().c_str(),
                static_cast<int>(::getpid()), groups.fetch_add(1), static_cast<long long>(monotonic_ns()));
  std::vector<std::shared_ptr<ProgressBoard>> boards;
  for (int r = 0; r < size; ++r) {
    std::shared_ptr<ProgressBoard> b = open_file(name, r, size);
    if (!b) break;
    boards.push_back(std::move(b));
  }
  ::unlink(name);
  if (static_cast<int>(boards.size()) != size) boards.clear();
  return boards;
}

void ProgressBoard::unlink_file() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

ProgressBoard::Slot* ProgressBoard::slot(int rank) const {
  if (rank < 0 || rank >= size_) return nullptr;
  return reinterpret_cast<Slot*>(static_cast<char*>(map_) + sizeof(Header) +
                                 static_cast<std::size_t>(rank) * sizeof(Slot));
}

void ProgressBoard::set_phase(Phase phase) {
  Slot* s = slot(rank_);
  store(s->phase_ns, monotonic_ns());
  store(s->phase, static_cast<std::uint32_t>(phase));
}

Phase ProgressBoard::phase() const { return static_cast<Phase>(load(slot(rank_)->phase)); }

void ProgressBoard::issued(int comm, std::uint64_t seq) {
  if (comm < 0 || comm >= kBoardComms) return;
  store(slot(rank_)->comm[comm].issued, seq);
}

void ProgressBoard::started(int comm, const CollectiveInfo& info) {
  if (comm < 0 || comm >= kBoardComms) return;
  CommSlot& c = slot(rank_)->comm[comm];
  const std::uint32_t v = load(c.version);
  store(c.version, v + 1);
  store(c.info_seq, info.seq);
  store(c.count, info.count);
  store(c.kind, static_cast<std::int32_t>(info.kind));
  store(c.op, static_cast<std::int32_t>(info.op));
  store(c.dtype, static_cast<std::int32_t>(info.dtype));
  store(c.root, static_cast<std::int32_t>(info.root));
  const std::size_t n = std::min(info.label.size(), sizeof c.label - 1);
  std::memcpy(c.label, info.label.data(), n);
  c.label[n] = '\0';
  store(c.version, v + 2);
  store(c.started_ns, monotonic_ns());
  store(c.started, info.seq);
}

void ProgressBoard::completed(int comm, std::uint64_t seq) {
  if (comm < 0 || comm >= kBoardComms) return;
  CommSlot& c = slot(rank_)->comm[comm];
  if (load(c.completed) < seq) store(c.completed, seq);
}

std::optional<RankSnapshot> ProgressBoard::read(int rank) const {
  const Slot* s = slot(rank);
  if (s == nullptr) return std::nullopt;
  if (private_only_ && rank != rank_) return std::nullopt;
  RankSnapshot out;
  out.rank = rank;
  out.pid = load(s->pid);
  if (out.pid == 0) return std::nullopt;
  out.phase = static_cast<Phase>(load(s->phase));
  out.phase_ns = load(s->phase_ns);
  const std::int64_t now = monotonic_ns();
  out.phase_age_s = out.phase_ns > 0 ? static_cast<double>(now - out.phase_ns) * 1e-9 : 0;
  for (int i = 0; i < kBoardComms; ++i) {
    const CommSlot& c = s->comm[i];
    CommSnapshot& o = out.comm[i];
    for (int attempt = 0; attempt < 3; ++attempt) {
      const std::uint32_t v = load(c.version);
      o.info_seq = load(c.info_seq);
      o.count = load(c.count);
      o.kind = load(c.kind);
      o.op = load(c.op);
      o.dtype = load(c.dtype);
      o.root = load(c.root);
      std::memcpy(o.label, c.label, sizeof o.label);
      o.label[sizeof o.label - 1] = '\0';
      if ((v & 1) == 0 && load(c.version) == v) break;
    }
    o.issued = load(c.issued);
    o.started = load(c.started);
    o.completed = load(c.completed);
    o.started_ns = load(c.started_ns);
    out.started_age_s[i] = o.started_ns > 0 ? static_cast<double>(now - o.started_ns) * 1e-9 : 0;
  }
  if (rank != rank_) {
    process_state(out.pid, out.stopped, out.gone);
    // A slot left by a process that is gone, from before this job's rank wrote it.
    if (out.gone && out.phase == Phase::absent) return std::nullopt;
  }
  return out;
}

std::vector<RankSnapshot> ProgressBoard::read_host() const {
  std::vector<RankSnapshot> out;
  for (int r = 0; r < size_; ++r) {
    if (auto s = read(r)) out.push_back(*s);
  }
  return out;
}

}  // namespace tutti::detail
