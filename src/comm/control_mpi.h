// The control channel over MPI (see control.h). Internal header.
#pragma once

#include <mpi.h>

#include <memory>

#include "comm/control.h"

namespace tutti::detail {

// A channel on a duplicate of `parent` (collective over parent), with MPI_ERRORS_RETURN.
// Ending the job is MPI_Abort on MPI_COMM_WORLD.
std::unique_ptr<ControlChannel> make_mpi_control(MPI_Comm parent);

}  // namespace tutti::detail
