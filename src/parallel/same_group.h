// The check every sequence-parallel layer makes of its split. Internal to src/parallel.
#pragma once

#include "tutti/core/error.h"
#include "tutti/parallel/sequence_parallel.h"

namespace tutti::parallel {

// `sequence`, after InvalidArgument unless it (when given) splits over the layer's `group`.
inline SequenceParallel* same_group(SequenceParallel* sequence, const Communicator& group, const char* layer) {
  TUTTI_CHECK_ARG(sequence == nullptr || &sequence->group() == &group, layer,
                  ": the sequence-parallel split is over another group than the layer's");
  return sequence;
}

}  // namespace tutti::parallel
