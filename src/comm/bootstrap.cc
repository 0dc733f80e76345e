// The Bootstrap interface's default, and its MPI implementation.
#include "comm/bootstrap_mpi.h"

#include "core/mpi_check.h"
#include "tutti/core/error.h"

namespace tutti {

std::string Bootstrap::broadcast(std::string_view bytes, int root) {
  TUTTI_CHECK_ARG(root >= 0 && root < size(), "Bootstrap::broadcast: root ", root, " of ", size(), " rank(s)");
  return allgather(rank() == root ? bytes : std::string_view())[static_cast<std::size_t>(root)];
}

namespace detail {

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

}  // namespace detail
}  // namespace tutti
