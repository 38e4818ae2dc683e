// The two models of `kolo-bench scaling`, written once for every system the
// benchmark runs (kolo, independent, plain libtorch, c10d Gloo).
//
// The CNN is the seed's Keras model from examples/fashion_mnist/model.h, the
// very class the example trains (1.2 M parameters).
// The MLP 784-4096-4096-10 (20.8 M parameters) is the communication-heavy one.
#pragma once

#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "model.h"  // examples/fashion_mnist

namespace kolo::bench {

using ScalingCnn = fashion_mnist::Cnn;

struct ScalingMlpImpl : torch::nn::Module {
  ScalingMlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 4096))),
        fc2(register_module("fc2", torch::nn::Linear(4096, 4096))),
        fc3(register_module("fc3", torch::nn::Linear(4096, 10))) {}

  torch::Tensor forward(torch::Tensor x) {  // (B, 1, 28, 28) or (B, 784) in [0, 1]
    x = x.flatten(1);
    x = torch::relu(fc1(x));
    x = torch::relu(fc2(x));
    return fc3(x);  // (B, 10) logits
  }

  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(ScalingMlp);

}  // namespace kolo::bench
