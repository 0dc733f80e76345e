// Fault injection for tests of how a job fails. Internal header.
//
//   TUTTI_FAULT="<rank>:<action>@<point>"  (several, separated by ';')
//     action  throw   a tutti::Error ("fault injected by TUTTI_FAULT ...") from that point
//             stall   the process stops itself (SIGSTOP), as a hung or preempted rank would
//             exit    the process ends at once (_exit(42)), as a crashed rank would
//     point   start          the Job's constructor, before MPI_Init and its deadline
//             init           within the start-up's deadline, just before MPI_Init
//             ready          the end of the Job's constructor (the communicators exist)
//             collective=N   the N-th collective this process issues (any communicator),
//                            before it is handed to the backend
//
// Read once; costs one atomic increment per collective when unset.
#pragma once

#include <cstdint>

namespace tutti::detail {

enum class FaultPoint { start, init, ready, collective };

// Acts when TUTTI_FAULT names this rank (error_rank()) and this point.
void inject_fault(FaultPoint point);

}  // namespace tutti::detail
