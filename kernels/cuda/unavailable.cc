// A build without CUDA still links the CUDA launchers that the dispatchers name: each one
// here throws. They are never reached in practice, since no Tensor can live on a GPU in such
// a build (Device::require_available() refuses it).
#include "tutti/core/error.h"

// Each family's stubs, in its own section.
// ---- linear, elementwise, cross_entropy, layernorm ----
// ---- conv, reduce, cast, optimizer ----
