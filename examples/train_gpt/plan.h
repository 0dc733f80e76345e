// train_gpt --plan: the memory plan of the run the flags describe (train::memory_plan), per
// rank, and the largest micro-batch that fits --device-memory, without training.
#pragma once

#include "flags.h"

namespace gpt {

// Prints the plan to stdout. Returns 0 when it fits --device-memory (or none is given), 1 with
// what to change on stderr when it does not. Needs no mpirun: --world-size gives the ranks.
int print_plan(Flags f);

}  // namespace gpt
