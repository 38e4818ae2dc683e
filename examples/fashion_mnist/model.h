// The seed's Keras CNN for Fashion-MNIST, shared by the example (main.cc) and
// `kolo-bench scaling`, so both train exactly the same model:
//
//   Conv2D(32, 3x3, ReLU) -> Conv2D(64, 3x3, ReLU) -> MaxPool(2x2) -> Dropout(0.25)
//   -> Flatten -> Dense(128, ReLU) -> Dropout(0.5) -> Dense(10)
//
// 1.2 M parameters, almost all of them in fc1 (9216 x 128).
//
// Each layer is a kolo::ShardedUnit: the unit ZeRO stage 3 gathers and
// releases (docs/zero.md). Parameter names are those of the plain layers, and
// until a stage-3 ZeroOptimizer adopts it a unit just runs its layer.
#pragma once

#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "kolo/torch/zero.h"

namespace fashion_mnist {

struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv1(register_module(
            "conv1", kolo::ShardedUnit(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3))))),
        conv2(register_module(
            "conv2", kolo::ShardedUnit(torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3))))),
        fc1(register_module("fc1", kolo::ShardedUnit(torch::nn::Linear(64 * 12 * 12, 128)))),
        fc2(register_module("fc2", kolo::ShardedUnit(torch::nn::Linear(128, 10)))) {}

  torch::Tensor forward(torch::Tensor x) {  // (B, 1, 28, 28) in [0, 1]
    x = torch::relu(conv1(x));              // (B, 32, 26, 26)
    x = torch::relu(conv2(x));              // (B, 64, 24, 24)
    x = torch::max_pool2d(x, 2);            // (B, 64, 12, 12)
    x = torch::dropout(x, 0.25, is_training());
    x = x.flatten(1);         // (B, 9216)
    x = torch::relu(fc1(x));  // (B, 128)
    x = torch::dropout(x, 0.5, is_training());
    return fc2(x);  // (B, 10) logits; the loss applies softmax
  }

  kolo::ShardedUnit conv1, conv2, fc1, fc2;
};
TORCH_MODULE(Cnn);

}  // namespace fashion_mnist
