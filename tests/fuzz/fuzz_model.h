// The small model and optimizer the checkpoint fuzz targets load into, and
// make_seeds writes seeds for (so that valid seeds get past the manifest).
#pragma once

#include <torch/torch.h>

namespace kolo::fuzz {

struct FuzzNet : torch::nn::Module {
  FuzzNet() {
    fc = register_module("fc", torch::nn::Linear(3, 2));
    register_buffer("steps", torch::zeros({1}));
  }
  torch::nn::Linear fc{nullptr};
};

}  // namespace kolo::fuzz
