// StateDict: a named collection of tensors, the unit of saving and loading. A model, an
// optimizer and a loss scaler each turn their state into one (save) and take it back (load);
// a checkpoint file stores several under prefixes ("model.", "optim.", "scaler.").
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "tutti/core/tensor.h"

namespace tutti {

// Ordered by name, so iteration (and a file written from it) is deterministic. Tensors in a
// StateDict returned by a save are CPU copies, safe to keep after training goes on.
using StateDict = std::map<std::string, Tensor>;

// One-element tensors for scalar state (step counts, scales), and reading them back.
Tensor scalar_tensor(double value);            // f32 [1] (a loss scale, a learning rate)
Tensor int_scalar_tensor(std::int64_t value);  // i64 [1]
// Throws InvalidArgument naming the key when it is missing, not a 1-element tensor, or of the
// wrong kind.
double get_scalar(const StateDict& state, const std::string& key);
std::int64_t get_int_scalar(const StateDict& state, const std::string& key);
// The tensor under `key`; throws InvalidArgument naming the key when it is missing.
const Tensor& get_tensor(const StateDict& state, const std::string& key);

}  // namespace tutti
