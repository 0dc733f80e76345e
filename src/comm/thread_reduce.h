// The arithmetic of the thread backend (ThreadGroup): a reduction over every rank's input, as
// the real backends compute it (halves in fp32, rounded once; in rank order). Internal header.
#pragma once

#include <cstdint>
#include <vector>

#include "tutti/comm/communicator.h"

namespace tutti::detail {

// op over ranks of elements [first, first + n) of every input, into `out` (n elements).
void reduce(const std::vector<Tensor>& inputs, ReduceOp op, DType dtype, std::int64_t first, std::int64_t n,
            std::vector<char>& out);

}  // namespace tutti::detail
