// The Trainer tests' data set (trainer_test.cc, elastic_trainer_test.cc):
// `samples` random rows of 7 features, each of one of 5 classes.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "kolo/torch/trainer.h"

namespace kolo::testing {

struct ClassificationData {
  explicit ClassificationData(int64_t samples)
      : x(torch::randn({samples, 7})), y(torch::randint(0, 5, {samples}, torch::kLong)) {}
  torch::Tensor x, y;
  Dataset set() const {
    return {x.size(0), [this](const torch::Tensor& rows) {
              return std::make_pair(x.index_select(0, rows), y.index_select(0, rows));
            }};
  }
};

}  // namespace kolo::testing
