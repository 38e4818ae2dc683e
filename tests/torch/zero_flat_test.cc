// ZeroOptimizer's flat buffers (kolo/torch/zero.h, "Flat buffers"): at
// stages 1 and 2 the model's parameters are views of one flat buffer per
// bucket and this rank's slice is a view of it, not a copy; at stage 1 the
// gradients are views of a flat gradient buffer, reduced in place.
//
//  - Memory: after a step at world size 2, stage 1 holds less than
//    DistributedOptimizer (params + grads + Adam state, from the accounting
//    API and from the tensors), 12 bytes per float32 parameter against 16;
//    stage 2 less again, stage 3 less again. The wrapped optimizer's
//    parameters share the model parameters' storage and memory.
//  - Soundness of the views: gradients set to none (Module::zero_grad(true))
//    and a parameter whose storage was replaced (as torch::load does) are
//    taken back into the buffers, and training stays equal to
//    DistributedOptimizer; after step() the stage-1 gradients read zero.
//  - Several parameter groups and mixed dtypes (float32 and float64 buckets)
//    at stages 1 and 2 match DistributedOptimizer at world sizes 2 and 3.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "kolo/torch/optimizer.h"
#include "kolo/torch/zero.h"
#include "optimizer_harness.h"
#include "torch_harness.h"
#include "zero_harness.h"

namespace kolo {
namespace {

namespace zt = zero_testing;
using testing::run_with_engines;

constexpr int64_t kRowsPerRank = 3;
constexpr int64_t kNumel = 174;  // ZeroNet's elements
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

DistributedOptimizerOptions ddp_options(Engine& engine) {
  DistributedOptimizerOptions o;
  o.engine = &engine;
  o.timeout = testing::kTorchTimeout;
  return o;
}

// Whether t's first element lies inside the memory of one of `params`.
bool inside_a_parameter(const torch::Tensor& t, const std::vector<torch::Tensor>& params) {
  const auto* first = static_cast<const char*>(t.data_ptr());
  for (const torch::Tensor& p : params) {
    const auto* begin = static_cast<const char*>(p.data_ptr());
    if (t.storage().unsafeGetStorageImpl() == p.storage().unsafeGetStorageImpl() &&
        first >= begin && first < begin + bytes_of(p)) {
      return true;
    }
  }
  return false;
}

TEST(ZeroFlat, EachStageHoldsLessThanDistributedOptimizerAndTheSliceIsTheParameters) {
  torch::set_num_threads(1);
  torch::manual_seed(5);
  constexpr int kWorld = 2;
  zt::ZeroNet initial;
  const auto batches = zt::make_batches(2, kWorld * kRowsPerRank);
  // Rank 0's bytes after the last step: params + grads + Adam state.
  int64_t ddp_total = 0;
  std::vector<int64_t> stage_total(4, 0);
  {
    std::vector<std::shared_ptr<zt::ZeroNet>> models;
    for (int r = 0; r < kWorld; ++r) models.push_back(zt::copy_of(initial));
    run_with_engines(kWorld, [&](int rank, Engine& engine) {
      zt::ZeroNet& model = *models[rank];
      auto adam = zt::make_optimizer(zt::Kind::kAdam, model.parameters());
      DistributedOptimizer ddp(*adam, model.named_parameters(), ddp_options(engine));
      for (const zt::Batch& batch : batches) {
        ddp.zero_grad();
        zt::loss_of(model, batch.share(rank, kWorld)).backward();
        ddp.step();
      }
      int64_t total = optimizer_state_bytes(*adam);
      for (const auto& p : model.parameters()) total += bytes_of(p) + bytes_of(p.grad());
      EXPECT_EQ(total, 16 * kNumel);  // float32 parameter, gradient, exp_avg, exp_avg_sq
      if (rank == 0) ddp_total = total;
      optimizer_testing::finish(engine);
    });
  }
  for (int stage : {1, 2, 3}) {
    std::vector<std::shared_ptr<zt::ZeroNet>> models;
    for (int r = 0; r < kWorld; ++r) models.push_back(zt::copy_of(initial));
    run_with_engines(kWorld, [&](int rank, Engine& engine) {
      zt::ZeroNet& model = *models[rank];
      const std::string what = "stage " + std::to_string(stage) + " rank " + std::to_string(rank);
      std::vector<const c10::TensorImpl*> identities;
      for (const auto& p : model.parameters()) identities.push_back(p.unsafeGetTensorImpl());
      auto adam = zt::make_optimizer(zt::Kind::kAdam, model.parameters());
      ZeroOptimizer zero(*adam, model, zt::zero_options(stage, engine));
      int64_t mine = 0;
      for (const auto& b : zero.buckets()) mine += b.shard_numel;
      for (const zt::Batch& batch : batches) {
        zero.zero_grad();
        zt::loss_of(model, batch.share(rank, kWorld)).backward();
        zero.step();
      }
      const ZeroMemory m = zero.memory();
      const int64_t total = m.param_bytes + m.grad_bytes + m.optimizer_state_bytes;
      if (rank == 0) stage_total[stage] = total;
      EXPECT_EQ(m.optimizer_state_bytes, 8 * mine) << what;
      if (stage == 1) {
        // 4 + 4 + 8/N bytes per parameter: no slice copies.
        EXPECT_EQ(m.param_bytes, 4 * kNumel) << what;
        EXPECT_EQ(m.grad_bytes, 4 * kNumel) << what;
        EXPECT_LT(m.peak_total_bytes, 16 * kNumel) << what;
      }
      // The model keeps its parameter tensors (set_data, not new tensors).
      const auto params = model.parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(params[i].unsafeGetTensorImpl(), identities[i]) << what;
      }
      if (stage < 3) {
        // One bucket: every parameter is a view of one flat buffer, and every
        // piece the wrapped optimizer steps lies in a parameter's memory.
        std::set<const c10::StorageImpl*> storages;
        for (const auto& p : params) storages.insert(p.storage().unsafeGetStorageImpl());
        EXPECT_EQ(storages.size(), 1u) << what;
        int64_t pieces = 0;
        for (const auto& group : adam->param_groups()) {
          for (const auto& piece : group.params()) {
            EXPECT_TRUE(inside_a_parameter(piece, params)) << what;
            pieces += piece.numel();
          }
        }
        EXPECT_EQ(pieces, mine) << what;
        // Writing through a piece changes the model's parameter: no copy.
        torch::NoGradGuard no_grad;
        torch::Tensor piece = adam->param_groups()[0].params()[0];
        auto sum_of_params = [&] {
          double sum = 0;
          for (const auto& p : params) sum += p.sum().item<double>();
          return sum;
        };
        const double before = sum_of_params();
        piece.add_(1.0);
        EXPECT_NEAR(sum_of_params() - before, static_cast<double>(piece.numel()), 1e-3) << what;
        piece.sub_(1.0);
      }
      if (stage == 1) {
        // The gradients share one flat buffer and read zero after step().
        std::set<const c10::StorageImpl*> storages;
        for (const auto& p : params) {
          ASSERT_TRUE(p.grad().defined()) << what;
          storages.insert(p.grad().storage().unsafeGetStorageImpl());
          EXPECT_EQ(p.grad().abs().max().item<float>(), 0.0f) << what;
        }
        EXPECT_EQ(storages.size(), 1u) << what;
      }
      optimizer_testing::finish(engine);
    });
  }
  EXPECT_EQ(stage_total[1], 12 * kNumel);  // 4 + 4 + 8/2
  EXPECT_LT(stage_total[1], ddp_total);
  EXPECT_LT(stage_total[2], stage_total[1]);
  EXPECT_LT(stage_total[3], stage_total[2]);
}

// Gradients set to none, and a parameter whose storage is replaced between
// steps, are taken back into the flat buffers; training equals ddp's.
TEST(ZeroFlat, GradientsSetToNoneAndReplacedParametersAreTakenBack) {
  torch::set_num_threads(1);
  torch::manual_seed(6);
  constexpr int kWorld = 2;
  constexpr int kSteps = 4;
  zt::ZeroNet initial;
  const auto batches = zt::make_batches(kSteps, kWorld * kRowsPerRank);
  for (int stage : {1, 2}) {
    std::vector<std::shared_ptr<zt::ZeroNet>> ddp_models, zero_models;
    for (int r = 0; r < kWorld; ++r) {
      ddp_models.push_back(zt::copy_of(initial));
      zero_models.push_back(zt::copy_of(initial));
    }
    run_with_engines(kWorld, [&](int rank, Engine& engine) {
      const std::string what = "stage " + std::to_string(stage) + " rank " + std::to_string(rank);
      zt::ZeroNet& ddp_model = *ddp_models[rank];
      zt::ZeroNet& zero_model = *zero_models[rank];
      auto ddp_inner = zt::make_optimizer(zt::Kind::kAdam, ddp_model.parameters());
      auto zero_inner = zt::make_optimizer(zt::Kind::kAdam, zero_model.parameters());
      DistributedOptimizer ddp(*ddp_inner, ddp_model.named_parameters(), ddp_options(engine));
      ZeroOptimizer zero(*zero_inner, zero_model, zt::zero_options(stage, engine));
      torch::Tensor weight = zero_model.named_parameters()["fc1.weight"];
      for (int s = 0; s < kSteps; ++s) {
        const zt::Batch mine = batches[s].share(rank, kWorld);
        ddp.zero_grad();
        zt::loss_of(ddp_model, mine).backward();
        ddp.step();
        if (s == 1) {
          zero_model.zero_grad(/*set_to_none=*/true);  // backward makes new gradients
        } else {
          zero.zero_grad();
        }
        if (s == 2) {
          // What torch::load into the model does: the parameter gets other storage.
          torch::NoGradGuard no_grad;
          weight.set_(weight.clone());
        }
        zt::loss_of(zero_model, mine).backward();
        zero.step();
        // Back in the flat buffer: fc1.weight and fc1.bias share storage again.
        EXPECT_EQ(weight.storage().unsafeGetStorageImpl(),
                  zero_model.named_parameters()["fc1.bias"].storage().unsafeGetStorageImpl())
            << what << " step " << s;
      }
      optimizer_testing::expect_params_close(zero_model, ddp_model, kRtol, kAtol, what);
      optimizer_testing::finish(engine);
    });
  }
}

// fc1 float32 in parameter group 0, fc2 float64 in group 1 (another rate).
struct MixedNet : torch::nn::Module {
  MixedNet() {
    fc1 = register_module("fc1", torch::nn::Linear(7, 13));
    fc2 = register_module("fc2", torch::nn::Linear(13, 5));
    fc2->to(torch::kDouble);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(torch::relu(fc1(x)).to(torch::kDouble));
  }
  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};

std::unique_ptr<torch::optim::Adam> grouped_adam(MixedNet& model) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(model.fc1->parameters());
  groups.emplace_back(model.fc2->parameters(), std::make_unique<torch::optim::AdamOptions>(5e-3));
  return std::make_unique<torch::optim::Adam>(std::move(groups), torch::optim::AdamOptions(1e-2));
}

TEST(ZeroFlat, ParameterGroupsAndMixedDtypesMatchDistributedOptimizer) {
  torch::set_num_threads(1);
  torch::manual_seed(7);
  constexpr int kSteps = 3;
  MixedNet initial;
  for (int world : {2, 3}) {
    const auto batches = zt::make_batches(kSteps, world * kRowsPerRank);
    for (int stage : {1, 2}) {
      std::vector<std::shared_ptr<MixedNet>> ddp_models, zero_models;
      for (int r = 0; r < world; ++r) {
        ddp_models.push_back(optimizer_testing::clone_of(initial));
        zero_models.push_back(optimizer_testing::clone_of(initial));
      }
      run_with_engines(world, [&](int rank, Engine& engine) {
        const std::string what = "stage " + std::to_string(stage) + " world " +
                                 std::to_string(world) + " rank " + std::to_string(rank);
        MixedNet& ddp_model = *ddp_models[rank];
        MixedNet& zero_model = *zero_models[rank];
        auto ddp_inner = grouped_adam(ddp_model);
        auto zero_inner = grouped_adam(zero_model);
        DistributedOptimizer ddp(*ddp_inner, ddp_model.named_parameters(), ddp_options(engine));
        ZeroOptimizer zero(*zero_inner, zero_model, zt::zero_options(stage, engine));
        EXPECT_EQ(zero.buckets().size(), 2u) << what;  // one per dtype
        for (const zt::Batch& batch : batches) {
          const zt::Batch mine = batch.share(rank, world);
          auto loss = [&](MixedNet& model) {
            return torch::nn::functional::cross_entropy(model.forward(mine.x), mine.y);
          };
          ddp.zero_grad();
          loss(ddp_model).backward();
          ddp.step();
          zero.zero_grad();
          loss(zero_model).backward();
          zero.step();
        }
        EXPECT_EQ(zero_model.fc2->weight.scalar_type(), torch::kDouble) << what;
        optimizer_testing::expect_params_close(zero_model, ddp_model, kRtol, kAtol, what);
        optimizer_testing::finish(engine);
      });
    }
  }
}

}  // namespace
}  // namespace kolo
