// The Bootstrap over an MPI communicator (not owned: the caller frees it after this object).
// Internal header.
#pragma once

#include <mpi.h>

#include "tutti/comm/bootstrap.h"

namespace tutti::detail {

class MpiBootstrap final : public Bootstrap {
 public:
  explicit MpiBootstrap(MPI_Comm comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::string> allgather(std::string_view mine) override;
  void barrier() override;
  std::string broadcast(std::string_view bytes, int root) override;
  MPI_Comm comm() const { return comm_; }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace tutti::detail
