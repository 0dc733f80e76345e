// The one collective the split layers issue: an allreduce over their group, ordered on the
// module's stream. Internal to src/parallel.
#pragma once

#include <string>

#include "tutti/comm/communicator.h"

namespace tutti::parallel {

// `t` = op over the group of `t`, in place, ordered on `stream` (COLLECTIVE; nothing with one rank).
inline void reduce_over(Communicator& group, const Tensor& t, const Stream& stream, const std::string& label,
                        ReduceOp op = ReduceOp::sum) {
  if (group.size() == 1) return;
  group.allreduce(t, op, {.label = label, .stream = stream}).wait(stream);
}

}  // namespace tutti::parallel
