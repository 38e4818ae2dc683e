// A small model for the frontend's tests: a Linear layer (parameters) and a
// BatchNorm1d (float buffers and an int64 counter), and one training step.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

namespace kolo::testing {

struct Net : torch::nn::Module {
  explicit Net(int64_t out = 3) {
    fc = register_module("fc", torch::nn::Linear(4, out));
    bn = register_module("bn", torch::nn::BatchNorm1d(out));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn(fc(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

// One step on a fixed batch scaled by `scale`: creates the optimizer's lazy
// state and moves the BatchNorm buffers.
inline void train_step(Net& net, torch::optim::Optimizer& optimizer, float scale) {
  optimizer.zero_grad();
  torch::Tensor x = torch::arange(20, torch::kFloat).reshape({5, 4}) * scale;
  net.forward(x).pow(2).sum().backward();
  optimizer.step();
}

// Parameters then buffers.
inline std::vector<torch::Tensor> all_tensors(const torch::nn::Module& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net.named_parameters()) out.push_back(p.value());
  for (const auto& b : net.named_buffers()) out.push_back(b.value());
  return out;
}

// The raw bytes of every tensor (bitwise comparison).
inline std::string tensor_bytes(const torch::Tensor& t) {
  if (!t.defined()) return "<undefined>";
  const torch::Tensor c = t.contiguous();
  return std::string(c.scalar_type() == torch::kLong ? "i64:" : "t:") +
         std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.nbytes()));
}

inline std::string model_bytes(const torch::nn::Module& net) {
  std::string out;
  for (const auto& t : all_tensors(net)) out += tensor_bytes(t) + "|";
  return out;
}

}  // namespace kolo::testing
