// The example's models: the MLP and the small CNN of Fashion-MNIST's published baselines.
#pragma once

#include <memory>
#include <string>

#include <tutti/tutti.h>

namespace example {

struct ModelSpec {
  std::string name;         // "mlp" or "cnn"
  std::string fingerprint;  // "mlp-784-512-256-10": stored in checkpoints, checked on resume
  bool flat_input = true;   // [N, 784] (mlp) or [N, 1, 28, 28] (cnn)
};

// 784-512-256-10 with ReLU.
inline std::unique_ptr<tutti::nn::Sequential> make_mlp() {
  auto m = std::make_unique<tutti::nn::Sequential>();
  m->add<tutti::nn::Linear>(784, 512).add<tutti::nn::ReLU>();
  m->add<tutti::nn::Linear>(512, 256).add<tutti::nn::ReLU>();
  m->add<tutti::nn::Linear>(256, 10);
  return m;
}

// Two conv(3x3, pad 1) + ReLU + max-pool blocks (1->16->32 channels, 28->14->7), then a
// 1568-128-10 classifier: small enough to train on two CPU cores.
inline std::unique_ptr<tutti::nn::Sequential> make_cnn() {
  tutti::nn::Conv2dOptions same;
  same.padding = 1;
  auto m = std::make_unique<tutti::nn::Sequential>();
  m->add<tutti::nn::Conv2d>(1, 16, 3, same).add<tutti::nn::ReLU>().add<tutti::nn::MaxPool2d>();
  m->add<tutti::nn::Conv2d>(16, 32, 3, same).add<tutti::nn::ReLU>().add<tutti::nn::MaxPool2d>();
  m->add<tutti::nn::Flatten>().add<tutti::nn::Linear>(32 * 7 * 7, 128).add<tutti::nn::ReLU>();
  m->add<tutti::nn::Linear>(128, 10);
  return m;
}

inline ModelSpec spec_of(const std::string& name) {
  if (name == "mlp") return {"mlp", "mlp-784-512-256-10", true};
  return {"cnn", "cnn-c16-c32-fc128-10", false};
}

inline std::unique_ptr<tutti::nn::Sequential> make_model(const std::string& name) {
  return name == "mlp" ? make_mlp() : make_cnn();
}

}  // namespace example
