#include "tutti/nn/sequential.h"

#include <string>

namespace tutti::nn {

void Sequential::append(std::unique_ptr<Module> layer) {
  Module* raw = layer.get();
  register_module(std::to_string(layers_.size()), std::move(layer));
  layers_.push_back(raw);
  on_input_grad_changed();
}

void Sequential::on_input_grad_changed() {
  // Only the first layer's input is this container's input; every later one feeds a layer.
  if (!layers_.empty()) layers_.front()->set_input_grad(input_grad_needed());
}

std::string Sequential::describe() const {
  std::string s = "Sequential(";
  for (std::size_t i = 0; i < layers_.size(); ++i) s += (i ? ", " : "") + layers_[i]->describe();
  return s + ")";
}

Flops Sequential::flops(const Shape& sample, Shape& out) const {
  Flops sum;
  Shape shape = sample;
  for (const Module* layer : layers_) {
    Shape next;
    const Flops f = layer->flops(shape, next);
    sum.forward += f.forward;
    sum.backward += f.backward;
    shape = std::move(next);
  }
  out = shape;
  return sum;
}

std::int64_t Sequential::buffer_bytes(const Shape& input, DType dtype, Shape& out) const {
  std::int64_t sum = 0;
  Shape shape = input;
  for (const Module* layer : layers_) {
    Shape next;
    sum += layer->buffer_bytes(shape, dtype, next);
    shape = std::move(next);
  }
  out = shape;
  return sum;
}

Tensor Sequential::forward_impl(const Tensor& x) {
  Tensor h = x;
  for (Module* layer : layers_) h = layer->forward(h);
  return h;
}

Tensor Sequential::backward_impl(const Tensor& dy) {
  Tensor g = dy;
  for (std::size_t i = layers_.size(); i-- > 0;) g = layers_[i]->backward(g);
  return g;
}

}  // namespace tutti::nn
