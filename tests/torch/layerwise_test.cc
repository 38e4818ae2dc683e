// kolo::LARS and kolo::LAMB (kolo/torch/lars.h, lamb.h, layerwise.h):
//   - a few steps on a small model equal, element-wise, a reference written
//     here from the papers' algorithms in double precision (LARS: You, Gitman,
//     Ginsburg 2017, Algorithm 1, with NVIDIA LARC's clip; LAMB: You et al.
//     2019, Algorithm 2, with FusedLAMB's bias correction and decoupled weight
//     decay), biases and normalisation parameters excluded from adaptation
//     and weight decay;
//   - under DistributedOptimizer at 2-4 ranks they equal one process with the
//     whole batch;
//   - their state and group options survive a checkpoint, a broadcast and an
//     elastic commit, which all go through Optimizer::save/load;
//   - bad options and layouts are ContractErrors that say what is wrong.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kolo/torch/broadcast.h"
#include "kolo/torch/checkpoint.h"
#include "kolo/torch/elastic.h"
#include "kolo/torch/lamb.h"
#include "kolo/torch/lars.h"
#include "kolo/torch/optimizer.h"
#include "optimizer_harness.h"
#include "temp_dir.h"
#include "test_net.h"
#include "torch_harness.h"

namespace kolo {
namespace {

namespace ot = optimizer_testing;

// --- A small model with every kind of parameter -------------------------------

// (N, 6) -> Linear -> LayerNorm -> ReLU -> Linear -> (N, 3) logits.
struct Small : torch::nn::Module {
  Small() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 5));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({5})));
    fc2 = register_module("fc2", torch::nn::Linear(5, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(ln(fc1(x)))); }
  torch::nn::Linear fc1{nullptr};
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear fc2{nullptr};
};

// Written out, not computed with the rule under test.
const std::set<std::string> kExcluded = {"fc1.bias", "ln.weight", "ln.bias", "fc2.bias"};

constexpr int kSteps = 5;

struct Data {
  torch::Tensor x;  // (16, 6)
  torch::Tensor y;  // (16)
};

std::vector<Data> make_data() {
  std::vector<Data> data;
  for (int s = 0; s < kSteps; ++s) {
    data.push_back({torch::randn({16, 6}), torch::randint(0, 3, {16}, torch::kLong)});
  }
  return data;
}

void copy_parameters(torch::nn::Module& to, const torch::nn::Module& from) {
  torch::NoGradGuard no_grad;
  auto t = to.parameters();
  auto f = from.parameters();
  for (size_t i = 0; i < t.size(); ++i) t[i].copy_(f[i]);
}

torch::Tensor loss_of(Small& model, const Data& d) {
  return torch::nn::functional::cross_entropy(model.forward(d.x), d.y);
}

// --- The reference, in double precision ----------------------------------------

std::vector<double> values_of(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

double norm_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

struct LarsSettings {
  double lr = 0.5;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 1e-2;
  double eta = 0.02;
  double eps = 1e-8;
  bool clip = false;
};

struct LambSettings {
  double lr = 0.05;
  double b1 = 0.9;
  double b2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.05;
  bool bias_correction = true;
  double min_ratio = 0.01;
  double max_ratio = 10.0;
};

// Counts of layer-steps where a bound was reached (so a test can show its
// setting is exercised).
struct Bounds {
  int at_bound = 0;
  int inside = 0;
};

// Per parameter: its values and its optimizer state.
struct RefParam {
  std::vector<double> w, v, m, s;
  int64_t step = 0;
};

class Reference {
 public:
  explicit Reference(const Small& initial) {
    copy_parameters(model_, initial);
    for (const auto& item : model_.named_parameters()) {
      params_[item.key()].w = values_of(item.value());
    }
  }

  // One LARS step on `d`, per the paper: lambda = eta ||w|| / (||g|| + beta ||w|| + eps),
  // rate = lr lambda (clip: min(lr, lambda)), v = m v + rate (g + beta w), w -= v.
  void lars_step(const Data& d, const LarsSettings& o) {
    for (auto& [name, p] : gradients(d)) {
      RefParam& r = params_[name];
      const bool excluded = kExcluded.count(name) > 0;
      const double beta = excluded ? 0 : o.weight_decay;
      double rate = o.lr;
      if (!excluded) {
        const double wn = norm_of(r.w);
        const double gn = norm_of(p);
        double lambda = 1;
        if (wn > 0 && gn > 0) lambda = o.eta * wn / (gn + beta * wn + o.eps);
        if (o.clip) {
          (lambda < o.lr ? bounds_.inside : bounds_.at_bound)++;
          rate = std::min(o.lr, lambda);
        } else {
          rate = o.lr * lambda;
        }
      }
      if (r.v.empty()) r.v.assign(r.w.size(), 0);
      for (size_t e = 0; e < r.w.size(); ++e) {
        const double step = rate * (p[e] + beta * r.w[e]);
        r.v[e] = r.step == 0 ? step : o.momentum * r.v[e] + step;
        r.w[e] -= o.nesterov ? step + o.momentum * r.v[e] : r.v[e];
      }
      ++r.step;
    }
    write_back();
  }

  // One LAMB step on `d`, per Algorithm 2 with bias correction and
  // decoupled weight decay: u = m^ / (sqrt(v^) + eps) + lambda w,
  // w -= lr clamp(||w|| / ||u||) u.
  void lamb_step(const Data& d, const LambSettings& o) {
    for (auto& [name, g] : gradients(d)) {
      RefParam& r = params_[name];
      const bool excluded = kExcluded.count(name) > 0;
      const double decay = excluded ? 0 : o.weight_decay;
      if (r.m.empty()) {
        r.m.assign(r.w.size(), 0);
        r.s.assign(r.w.size(), 0);
      }
      ++r.step;
      const double c1 = o.bias_correction ? 1 - std::pow(o.b1, r.step) : 1;
      const double c2 = o.bias_correction ? 1 - std::pow(o.b2, r.step) : 1;
      std::vector<double> u(r.w.size());
      for (size_t e = 0; e < r.w.size(); ++e) {
        r.m[e] = o.b1 * r.m[e] + (1 - o.b1) * g[e];
        r.s[e] = o.b2 * r.s[e] + (1 - o.b2) * g[e] * g[e];
        u[e] = (r.m[e] / c1) / (std::sqrt(r.s[e] / c2) + o.eps) + decay * r.w[e];
      }
      double ratio = 1;
      if (!excluded) {
        const double wn = norm_of(r.w);
        const double un = norm_of(u);
        if (wn > 0 && un > 0) {
          const double raw = wn / un;
          ratio = std::min(std::max(raw, o.min_ratio), o.max_ratio);
          (ratio == raw ? bounds_.inside : bounds_.at_bound)++;
        }
      }
      for (size_t e = 0; e < r.w.size(); ++e) r.w[e] -= o.lr * ratio * u[e];
    }
    write_back();
  }

  Small& model() { return model_; }
  const Bounds& bounds() const { return bounds_; }

 private:
  // Gradients of the loss at the current (float) parameters, by name.
  std::map<std::string, std::vector<double>> gradients(const Data& d) {
    for (auto& p : model_.parameters()) p.mutable_grad() = torch::Tensor();
    loss_of(model_, d).backward();
    std::map<std::string, std::vector<double>> out;
    for (const auto& item : model_.named_parameters()) {
      out[item.key()] = values_of(item.value().grad());
    }
    return out;
  }
  void write_back() {
    torch::NoGradGuard no_grad;
    for (const auto& item : model_.named_parameters()) {
      const std::vector<double>& w = params_[item.key()].w;
      item.value().copy_(torch::tensor(w, torch::kDouble).view(item.value().sizes()));
    }
  }

  Small model_;
  std::map<std::string, RefParam> params_;
  Bounds bounds_;
};

LARSOptions lars_options(const LarsSettings& s) {
  return LARSOptions(s.lr)
      .momentum(s.momentum)
      .nesterov(s.nesterov)
      .weight_decay(s.weight_decay)
      .trust_coefficient(s.eta)
      .eps(s.eps)
      .trust_clip(s.clip);
}

LAMBOptions lamb_options(const LambSettings& s) {
  return LAMBOptions(s.lr)
      .betas({s.b1, s.b2})
      .eps(s.eps)
      .weight_decay(s.weight_decay)
      .bias_correction(s.bias_correction)
      .min_trust_ratio(s.min_ratio)
      .max_trust_ratio(s.max_ratio);
}

// float32 steps against the double reference rounded to float after each
// step: the trajectories differ by float rounding only.
constexpr double kRefRtol = 1e-4;
constexpr double kRefAtol = 1e-6;

class Layerwise : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

// Runs kSteps of `optimizer` on `model` and of `reference_step` on the
// reference, and compares every parameter element-wise.
template <typename Step>
void expect_matches_reference(Small& model, torch::optim::Optimizer& optimizer,
                              Reference& reference, const std::vector<Data>& data,
                              Step reference_step, const Small& initial) {
  for (const Data& d : data) {
    optimizer.zero_grad();
    loss_of(model, d).backward();
    optimizer.step();
    reference_step(d);
  }
  ot::expect_params_close(model, reference.model(), kRefRtol, kRefAtol, "vs reference");
  // Every parameter moved: none was silently skipped.
  auto moved = model.named_parameters();
  auto start = initial.named_parameters();
  for (size_t i = 0; i < moved.size(); ++i) {
    EXPECT_GT((moved[i].value() - start[i].value()).abs().max().item<double>(), 1e-5)
        << moved[i].key();
  }
}

TEST_F(Layerwise, RecipeGroupsExcludeBiasesAndNormalisationParameters) {
  Small model;
  std::set<std::string> excluded;
  for (const auto& item : model.named_parameters()) {
    if (excluded_from_adaptation(item.key(), item.value())) excluded.insert(item.key());
  }
  EXPECT_EQ(excluded, kExcluded);
  // A 2-D parameter named bias is excluded by name.
  EXPECT_TRUE(excluded_from_adaptation("attn.bias", torch::zeros({2, 2})));
  EXPECT_FALSE(excluded_from_adaptation("bias_net.weight", torch::zeros({2, 2})));

  auto groups = layerwise_param_groups(model.named_parameters(),
                                       LAMBOptions(0.1).weight_decay(0.01).max_trust_ratio(5));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].params().size(), 2u);  // fc1.weight, fc2.weight
  EXPECT_EQ(groups[1].params().size(), 4u);
  const auto& adapted = static_cast<const LAMBOptions&>(groups[0].options());
  const auto& plain = static_cast<const LAMBOptions&>(groups[1].options());
  EXPECT_TRUE(adapted.adapt());
  EXPECT_DOUBLE_EQ(adapted.weight_decay(), 0.01);
  EXPECT_FALSE(plain.adapt());
  EXPECT_DOUBLE_EQ(plain.weight_decay(), 0);
  EXPECT_DOUBLE_EQ(plain.lr(), 0.1);
  EXPECT_DOUBLE_EQ(plain.max_trust_ratio(), 5);
}

void expect_lars_matches(const LarsSettings& s, bool expect_both_sides_of_clip) {
  torch::manual_seed(3);
  Small initial;
  const auto data = make_data();
  Small model;
  copy_parameters(model, initial);
  Reference reference(initial);
  LARS lars(layerwise_param_groups(model.named_parameters(), lars_options(s)));
  expect_matches_reference(
      model, lars, reference, data, [&](const Data& d) { reference.lars_step(d, s); }, initial);
  if (expect_both_sides_of_clip) {
    EXPECT_GT(reference.bounds().at_bound, 0);
    EXPECT_GT(reference.bounds().inside, 0);
  }
}

TEST_F(Layerwise, LarsMatchesThePapersAlgorithm) { expect_lars_matches({}, false); }

TEST_F(Layerwise, LarsWithNesterovAndTrustClipMatches) {
  LarsSettings s;
  s.nesterov = true;
  s.clip = true;
  s.lr = 0.1;
  expect_lars_matches(s, true);
}

TEST_F(Layerwise, LarsWithoutMomentumKeepsNoState) {
  LarsSettings s;
  s.momentum = 0;
  expect_lars_matches(s, false);
  Small model;
  LARS lars(model.parameters(), LARSOptions(0.1).momentum(0));
  torch::manual_seed(4);
  loss_of(model, make_data()[0]).backward();
  lars.step();
  EXPECT_TRUE(lars.state().empty());
}

void expect_lamb_matches(const LambSettings& s, bool expect_both_sides_of_clamp) {
  torch::manual_seed(5);
  Small initial;
  const auto data = make_data();
  Small model;
  copy_parameters(model, initial);
  Reference reference(initial);
  LAMB lamb(layerwise_param_groups(model.named_parameters(), lamb_options(s)));
  expect_matches_reference(
      model, lamb, reference, data, [&](const Data& d) { reference.lamb_step(d, s); }, initial);
  if (expect_both_sides_of_clamp) {
    EXPECT_GT(reference.bounds().at_bound, 0);
    EXPECT_GT(reference.bounds().inside, 0);
  }
}

TEST_F(Layerwise, LambMatchesThePapersAlgorithm) { expect_lamb_matches({}, false); }

TEST_F(Layerwise, LambWithoutBiasCorrectionAndATightClampMatches) {
  LambSettings s;
  s.bias_correction = false;
  s.min_ratio = 0.1;
  s.max_ratio = 0.125;
  expect_lamb_matches(s, true);
}

TEST_F(Layerwise, BadOptionsAreContractErrorsNamingTheGroup) {
  Small model;
  auto message = [&](auto make) {
    try {
      make();
    } catch (const ContractError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string m = message([&] { LARS(model.parameters(), LARSOptions(0.1).momentum(1.0)); });
  EXPECT_NE(m.find("momentum is 1"), std::string::npos) << m;
  m = message([&] { LARS(model.parameters(), LARSOptions(0.1).trust_coefficient(0)); });
  EXPECT_NE(m.find("trust_coefficient"), std::string::npos) << m;
  m = message([&] { LAMB(model.parameters(), LAMBOptions(0.1).betas({0.9, 1.0})); });
  EXPECT_NE(m.find("betas"), std::string::npos) << m;
  m = message(
      [&] { LAMB(model.parameters(), LAMBOptions(0.1).min_trust_ratio(2).max_trust_ratio(1)); });
  EXPECT_NE(m.find("min_trust_ratio"), std::string::npos) << m;
  // Another optimizer's options in a group.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(model.parameters(), std::make_unique<LARSOptions>(0.1));
  m = message([&] { LAMB lamb(std::move(groups)); });
  EXPECT_NE(m.find("parameter group 0 has options of type"), std::string::npos) << m;
}

TEST_F(Layerwise, LayoutsThatDoNotCoverTheParametersAreRejected) {
  Small model;
  LAMB lamb(model.parameters());
  const size_t n = model.parameters().size();
  LayerLayout layout;
  layout.layers = static_cast<int64_t>(n);
  layout.reduce_sum = [](torch::Tensor&) {};
  layout.runs.resize(1);
  for (size_t j = 0; j < n; ++j) {
    layout.runs[0].push_back({{static_cast<int64_t>(j), 0, model.parameters()[j].numel()}});
  }
  lamb.set_layout(layout);  // a valid layout: one run per parameter
  EXPECT_TRUE(lamb.has_layout());

  LayerLayout short_run = layout;
  short_run.runs[0][0][0].numel -= 1;
  EXPECT_THROW(lamb.set_layout(short_run), ContractError);
  LayerLayout bad_layer = layout;
  bad_layer.runs[0][1][0].layer = layout.layers;
  EXPECT_THROW(lamb.set_layout(bad_layer), ContractError);
  LayerLayout no_reduce = layout;
  no_reduce.reduce_sum = nullptr;
  EXPECT_THROW(lamb.set_layout(no_reduce), ContractError);
  lamb.clear_layout();
  EXPECT_FALSE(lamb.has_layout());
}

// A reduction that fails (under ZeRO: a peer gone) is rethrown by step(), and
// the optimizer is as it was: the next step equals the step that failed.
TEST_F(Layerwise, AFailedReductionLeavesParametersAndStateUnchanged) {
  for (const bool lars : {false, true}) {
    torch::manual_seed(8);
    Small model;
    std::unique_ptr<LayerwiseOptimizer> optimizer;
    if (lars) {
      optimizer = std::make_unique<LARS>(model.parameters(), LARSOptions(0.5));
    } else {
      optimizer = std::make_unique<LAMB>(model.parameters(), LAMBOptions(0.05));
    }
    const auto data = make_data();
    loss_of(model, data[0]).backward();
    optimizer->step();  // state exists
    LayerLayout layout;
    const auto params = model.parameters();
    layout.layers = static_cast<int64_t>(params.size());
    layout.runs.resize(1);
    for (size_t j = 0; j < params.size(); ++j) {
      layout.runs[0].push_back({{static_cast<int64_t>(j), 0, params[j].numel()}});
    }
    bool fail = true;
    layout.reduce_sum = [&fail](torch::Tensor&) {
      if (fail) throw RuntimeFault("rank 1 is gone");
    };
    optimizer->set_layout(layout);
    optimizer->zero_grad();
    loss_of(model, data[1]).backward();
    const std::string before = testing::model_bytes(model);
    EXPECT_THROW(optimizer->step(), RuntimeFault);
    EXPECT_EQ(testing::model_bytes(model), before) << (lars ? "LARS" : "LAMB");
    // The retried step is the step of a twin that never failed: the same
    // parameters and gradients, and the state saved after the failure.
    Small twin;
    copy_parameters(twin, model);
    std::unique_ptr<LayerwiseOptimizer> twin_optimizer;
    if (lars) {
      twin_optimizer = std::make_unique<LARS>(twin.parameters(), LARSOptions(0.5));
    } else {
      twin_optimizer = std::make_unique<LAMB>(twin.parameters(), LAMBOptions(0.05));
    }
    std::stringstream saved;
    torch::save(*optimizer, saved);
    torch::load(*twin_optimizer, saved);
    loss_of(twin, data[1]).backward();
    twin_optimizer->step();
    fail = false;
    optimizer->step();
    EXPECT_EQ(optimizer->reductions(), 1);
    EXPECT_EQ(testing::model_bytes(model), testing::model_bytes(twin)) << (lars ? "LARS" : "LAMB");
  }
}

// --- Under DistributedOptimizer ---------------------------------------------------

enum class Kind { kLars, kLamb };

std::unique_ptr<torch::optim::Optimizer> make_layerwise(Kind kind, ot::Mlp& model) {
  if (kind == Kind::kLars) {
    return std::make_unique<LARS>(layerwise_param_groups(
        model.named_parameters(),
        LARSOptions(0.5).momentum(0.9).weight_decay(1e-3).trust_coefficient(0.02)));
  }
  return std::make_unique<LAMB>(
      layerwise_param_groups(model.named_parameters(), LAMBOptions(0.02).weight_decay(0.01)));
}

struct DataParallelCase {
  Kind kind;
  int world;
};

class LayerwiseDataParallel : public ::testing::TestWithParam<DataParallelCase> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_P(LayerwiseDataParallel, RanksMatchOneProcessWithTheWholeBatch) {
  const auto [kind, world] = GetParam();
  constexpr int64_t kRows = 5;  // per rank
  torch::manual_seed(11);
  ot::Mlp initial;
  const auto batches = ot::make_batches(4, world * kRows);

  auto single = ot::clone_of(initial);
  auto single_optimizer = make_layerwise(kind, *single);
  for (const auto& batch : batches) {
    single_optimizer->zero_grad();
    ot::loss_of(*single, batch.x, batch.y).backward();
    single_optimizer->step();
  }

  ot::EngineWorld engines("threads", world);
  std::vector<std::shared_ptr<ot::Mlp>> models;
  for (int r = 0; r < world; ++r) models.push_back(ot::clone_of(initial));
  ot::run_ranks(world, [&](int rank) {
    auto engine = engines.engine(rank);
    ot::Mlp& model = *models[rank];
    auto optimizer = make_layerwise(kind, model);
    DistributedOptimizerOptions options;
    options.engine = engine.get();
    options.timeout = ot::kEngineTimeout;
    DistributedOptimizer distributed(*optimizer, model.named_parameters(), options);
    for (const auto& batch : batches) {
      distributed.zero_grad();
      ot::loss_of(model, batch.rows(rank, kRows, batch.x), batch.rows(rank, kRows, batch.y))
          .backward();
      distributed.step();
    }
    ot::finish(*engine);
  });
  for (int r = 0; r < world; ++r) {
    ot::expect_params_close(*models[r], *single, 1e-5, 1e-6, "rank " + std::to_string(r));
  }
  EXPECT_GT((single->fc1->weight - initial.fc1->weight).abs().max().item<double>(), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Ranks, LayerwiseDataParallel,
                         ::testing::Values(DataParallelCase{Kind::kLars, 2},
                                           DataParallelCase{Kind::kLars, 3},
                                           DataParallelCase{Kind::kLamb, 2},
                                           DataParallelCase{Kind::kLamb, 4}),
                         [](const ::testing::TestParamInfo<DataParallelCase>& info) {
                           return std::string(info.param.kind == Kind::kLars ? "Lars" : "Lamb") +
                                  std::to_string(info.param.world);
                         });

// --- State: checkpoints, broadcast, elastic commits ---------------------------------

std::unique_ptr<torch::optim::Optimizer> make_for_net(Kind kind, testing::Net& net, double lr) {
  if (kind == Kind::kLars) {
    return std::make_unique<LARS>(layerwise_param_groups(
        net.named_parameters(), LARSOptions(lr).momentum(0.9).weight_decay(1e-3)));
  }
  return std::make_unique<LAMB>(
      layerwise_param_groups(net.named_parameters(), LAMBOptions(lr).weight_decay(0.01)));
}

class LayerwiseState : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

// Save after 3 steps (with a learning rate changed on the way, as a schedule
// does), take 2 more; a fresh model and optimizer built with another rate
// load the file and take the same 2 steps: bitwise the same model.
TEST_P(LayerwiseState, CheckpointRoundTripResumesBitwise) {
  const Kind kind = GetParam();
  testing::TempDir dir("kolo-layerwise");
  const std::string path = dir.file("run.kolo");
  testing::run_with_engines(1, [&](int, Engine& engine) {
    CheckpointOptions o;
    o.engine = &engine;
    o.timeout = testing::kTorchTimeout;
    o.rng = false;
    testing::Net net;
    auto optimizer = make_for_net(kind, net, 0.05);
    for (int s = 0; s < 3; ++s) testing::train_step(net, *optimizer, 1.0f + s);
    optimizer->param_groups()[0].options().set_lr(0.03);
    CheckpointState saved;
    saved.epoch = 1;
    saved.step = 3;
    save_checkpoint(path, net, optimizer.get(), saved, o);
    testing::train_step(net, *optimizer, 2.0f);
    testing::train_step(net, *optimizer, 3.0f);

    testing::Net fresh;
    auto fresh_optimizer = make_for_net(kind, fresh, 0.5);
    load_checkpoint(path, fresh, fresh_optimizer.get(), o);
    EXPECT_DOUBLE_EQ(fresh_optimizer->param_groups()[0].options().get_lr(), 0.03);
    testing::train_step(fresh, *fresh_optimizer, 2.0f);
    testing::train_step(fresh, *fresh_optimizer, 3.0f);
    EXPECT_EQ(testing::model_bytes(fresh), testing::model_bytes(net));

    // The other optimizer's checkpoint is refused, naming both types.
    testing::Net other;
    auto wrong = make_for_net(kind == Kind::kLars ? Kind::kLamb : Kind::kLars, other, 0.1);
    const std::string m = testing::error_of([&] { load_checkpoint(path, other, wrong.get(), o); });
    EXPECT_NE(m.find(kind == Kind::kLars ? "LARS" : "LAMB"), std::string::npos) << m;
  });
}

// Ranks that diverged take rank 0's state: their next steps are identical.
TEST_P(LayerwiseState, BroadcastGivesEveryRankRankZerosState) {
  const Kind kind = GetParam();
  constexpr int kRanks = 3;
  std::mutex mutex;
  std::map<int, std::string> after;
  testing::run_with_engines(kRanks, [&](int rank, Engine& engine) {
    testing::Net net;
    auto optimizer = make_for_net(kind, net, 0.01 * (rank + 1));
    for (int s = 0; s <= rank; ++s) testing::train_step(net, *optimizer, 1.0f + rank);
    broadcast_parameters(net, 0, testing::on(engine));
    broadcast_optimizer_state(*optimizer, 0, testing::on(engine));
    testing::train_step(net, *optimizer, 4.0f);
    std::lock_guard<std::mutex> lock(mutex);
    after[rank] = testing::model_bytes(net);
  });
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(after[r], after[0]) << "rank " << r;
}

// restore() returns to the commit: the step after it is the step after the commit.
TEST_P(LayerwiseState, ElasticCommitRoundTrip) {
  const Kind kind = GetParam();
  testing::Net net;
  auto optimizer = make_for_net(kind, net, 0.05);
  elastic::TorchState state(net, optimizer.get(), 100, {}, {});
  testing::train_step(net, *optimizer, 1.0f);
  testing::train_step(net, *optimizer, 2.0f);
  state.commit();
  testing::train_step(net, *optimizer, 3.0f);
  const std::string from_commit = testing::model_bytes(net);
  testing::train_step(net, *optimizer, 5.0f);
  optimizer->param_groups()[0].options().set_lr(0.5);
  state.restore();
  EXPECT_DOUBLE_EQ(optimizer->param_groups()[0].options().get_lr(), 0.05);
  testing::train_step(net, *optimizer, 3.0f);
  EXPECT_EQ(testing::model_bytes(net), from_commit);
}

INSTANTIATE_TEST_SUITE_P(Kinds, LayerwiseState, ::testing::Values(Kind::kLars, Kind::kLamb),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return std::string(info.param == Kind::kLars ? "Lars" : "Lamb");
                         });

}  // namespace
}  // namespace kolo
