// Sequential: a chain of modules, each fed the previous one's output. Children are named by
// their index, so parameters are "0.weight", "0.bias", "2.weight", ...
//
// doc-test: wrap-main
// setup: const tutti::Device device = tutti::Device::cpu();
//   tutti::nn::Sequential model;
//   model.add<tutti::nn::Linear>(784, 512).add<tutti::nn::ReLU>().add<tutti::nn::Linear>(512, 10);
//   model.to(device).init(/*seed=*/1);
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "tutti/nn/module.h"

namespace tutti::nn {

class Sequential : public Module {
 public:
  Sequential() = default;

  // Appends a new T(args...) and returns the Sequential, for chaining.
  template <typename T, typename... Args>
  Sequential& add(Args&&... args) {
    emplace<T>(std::forward<Args>(args)...);
    return *this;
  }
  // Appends a new T(args...) and returns it (to configure it, or to build a Residual body).
  template <typename T, typename... Args>
  T& emplace(Args&&... args) {
    auto layer = std::make_unique<T>(std::forward<Args>(args)...);
    T& ref = *layer;
    append(std::move(layer));
    return ref;
  }
  // Appends a module built elsewhere.
  Sequential& add(std::unique_ptr<Module> layer) {
    append(std::move(layer));
    return *this;
  }

  std::size_t size() const { return layers_.size(); }
  Module& operator[](std::size_t i) const { return *layers_.at(i); }
  std::string describe() const override;
  // The sum of the layers', each fed the previous one's output shape.
  Flops flops(const Shape& sample, Shape& out) const override;
  // The layers' buffers, the shapes chained.
  std::int64_t buffer_bytes(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  void on_input_grad_changed() override;

 private:
  void append(std::unique_ptr<Module> layer);
  std::vector<Module*> layers_;
};

}  // namespace tutti::nn
