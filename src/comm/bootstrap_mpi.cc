// The MPI side of a Job (see bootstrap_mpi.h): MPI's life, the Bootstrap over an MPI
// communicator, and what the Job makes over MPI_COMM_WORLD.
#include "comm/bootstrap_mpi.h"

#include <mpi.h>

#include "comm/control_mpi.h"
#include "comm/mpi_engine.h"
#include "core/mpi_check.h"
#include "tutti/core/error.h"

namespace tutti::detail {
namespace {

// The Bootstrap over an MPI communicator (not owned: the caller frees it after this object).
class MpiBootstrap final : public Bootstrap {
 public:
  explicit MpiBootstrap(MPI_Comm comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::string> allgather(std::string_view mine) override;
  void barrier() override;
  std::string broadcast(std::string_view bytes, int root) override;

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

MpiBootstrap::MpiBootstrap(MPI_Comm comm) : comm_(comm) {
  TUTTI_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  TUTTI_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

std::vector<std::string> MpiBootstrap::allgather(std::string_view mine) {
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(size_)), offsets(static_cast<std::size_t>(size_));
  TUTTI_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_));
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    offsets[static_cast<std::size_t>(r)] = total;
    total += lens[static_cast<std::size_t>(r)];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  TUTTI_MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, comm_));
  std::vector<std::string> out;
  out.reserve(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    out.push_back(all.substr(static_cast<std::size_t>(offsets[static_cast<std::size_t>(r)]),
                             static_cast<std::size_t>(lens[static_cast<std::size_t>(r)])));
  }
  return out;
}

void MpiBootstrap::barrier() { TUTTI_MPI_CHECK(MPI_Barrier(comm_)); }

std::string MpiBootstrap::broadcast(std::string_view bytes, int root) {
  TUTTI_CHECK_ARG(root >= 0 && root < size_, "Bootstrap::broadcast: root ", root, " of ", size_, " rank(s)");
  long long len = rank_ == root ? static_cast<long long>(bytes.size()) : 0;
  TUTTI_MPI_CHECK(MPI_Bcast(&len, 1, MPI_LONG_LONG, root, comm_));
  std::string out(static_cast<std::size_t>(len), '\0');
  if (rank_ == root) out.assign(bytes);
  TUTTI_MPI_CHECK(MPI_Bcast(out.data(), static_cast<int>(len), MPI_CHAR, root, comm_));
  return out;
}

}  // namespace

bool MpiWorld::initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

bool MpiWorld::finalized() {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

bool MpiWorld::usable() { return initialized() && !finalized(); }

int MpiWorld::init_thread_multiple(int& argc, char**& argv) {
  int provided = MPI_THREAD_SINGLE;
  TUTTI_MPI_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided));
  return provided;
}

int MpiWorld::query_thread() {
  int provided = MPI_THREAD_SINGLE;
  TUTTI_MPI_CHECK(MPI_Query_thread(&provided));
  return provided;
}

bool MpiWorld::thread_multiple(int provided) { return provided >= MPI_THREAD_MULTIPLE; }

void MpiWorld::finalize() { MPI_Finalize(); }

std::string MpiWorld::version() {
  int major = 0, minor = 0, len = 0;
  MPI_Get_version(&major, &minor);
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  MPI_Get_library_version(lib, &len);
  std::string first(lib, static_cast<std::size_t>(len));
  first = first.substr(0, first.find_first_of("\n,"));
  return "MPI " + std::to_string(major) + "." + std::to_string(minor) + ", " + first;
}

std::unique_ptr<ControlChannel> MpiWorld::make_control() { return make_mpi_control(MPI_COMM_WORLD); }

struct MpiWorld::Impl {
  MPI_Comm world = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD for the bootstrap and summary
  MPI_Comm local = MPI_COMM_NULL;
  std::unique_ptr<MpiBootstrap> boot;        // over world
  std::unique_ptr<MpiBootstrap> local_boot;  // over local
};

MpiWorld::MpiWorld() : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  TUTTI_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &m.world));
  TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(m.world, MPI_ERRORS_RETURN));
  m.boot = std::make_unique<MpiBootstrap>(m.world);
  TUTTI_MPI_CHECK(MPI_Comm_split_type(m.world, MPI_COMM_TYPE_SHARED, m.boot->rank(), MPI_INFO_NULL, &m.local));
  m.local_boot = std::make_unique<MpiBootstrap>(m.local);
}

MpiWorld::~MpiWorld() { release(/*free=*/true); }

Bootstrap& MpiWorld::world() { return *impl_->boot; }
Bootstrap& MpiWorld::local() { return *impl_->local_boot; }

std::unique_ptr<ControlChannel> MpiWorld::control() { return make_mpi_control(impl_->world); }

std::shared_ptr<Backend> MpiWorld::make_mpi_backend(Device device, CommOptions options, int board_comm) {
  return detail::make_mpi_backend(impl_->world, device, std::move(options), board_comm);
}

std::shared_ptr<Backend> MpiWorld::make_split_backend(int color, int key, bool nccl, Device device, CommOptions options,
                                                      int board_comm) {
  MPI_Comm sub = MPI_COMM_NULL;
  TUTTI_MPI_CHECK(MPI_Comm_split(impl_->world, color, key, &sub));
  // The backends keep duplicates of it.
  struct Free {
    MPI_Comm* comm;
    ~Free() {
      if (*comm != MPI_COMM_NULL && usable()) MPI_Comm_free(comm);
    }
  } free_sub{&sub};
  TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN));
  if (!nccl) return detail::make_mpi_backend(sub, device, std::move(options), board_comm);
  MpiBootstrap boot(sub);
  return make_nccl_backend(boot, make_mpi_control(sub), device, std::move(options), board_comm);
}

void MpiWorld::release(bool free) noexcept {
  Impl& m = *impl_;
  m.local_boot.reset();
  m.boot.reset();
  if (free && usable()) {
    if (m.local != MPI_COMM_NULL) MPI_Comm_free(&m.local);
    if (m.world != MPI_COMM_NULL) MPI_Comm_free(&m.world);
  }
  m.local = m.world = MPI_COMM_NULL;
}

}  // namespace tutti::detail
