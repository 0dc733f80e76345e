#include "tutti/core/state_dict.h"

namespace tutti {

Tensor scalar_tensor(double value) { return Tensor::from_floats({static_cast<float>(value)}, {1}, DType::f32); }

Tensor int_scalar_tensor(std::int64_t value) { return Tensor::from_ints({value}, {1}, DType::i64); }

const Tensor& get_tensor(const StateDict& state, const std::string& key) {
  const auto it = state.find(key);
  TUTTI_CHECK_ARG(it != state.end() && it->second.defined(), "state dict has no entry '", key, "'");
  return it->second;
}

double get_scalar(const StateDict& state, const std::string& key) {
  const Tensor& t = get_tensor(state, key);
  TUTTI_CHECK_ARG(t.numel() == 1 && is_floating(t.dtype()), "state dict entry '", key,
                  "' must be a floating scalar, got ", t.str());
  return t.to_floats()[0];
}

std::int64_t get_int_scalar(const StateDict& state, const std::string& key) {
  const Tensor& t = get_tensor(state, key);
  TUTTI_CHECK_ARG(t.numel() == 1 && !is_floating(t.dtype()), "state dict entry '", key,
                  "' must be an integer scalar, got ", t.str());
  return t.to_ints()[0];
}

}  // namespace tutti
