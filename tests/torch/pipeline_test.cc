// Pipeline parallelism with ranks as threads (one stage per rank-thread, over
// threads communicators): the pipelined model's loss and parameters after
// several steps equal the unsplit model's on the same global batch, for both
// schedules at 2-4 stages, with and without dropout; 1F1B holds at most p - s
// micro-batches of activations on stage s, GPipe all m; partitions by hand,
// by parameter count and by time; a model that differs on one rank is a
// ContractError on every rank.
//
// Tolerance. Micro-batches change only the order in which float32 gradient
// contributions are summed (m partial sums instead of one), so after 3 steps
// of SGD with momentum the parameters agree to rtol 1e-4, atol 1e-6 and the
// losses to rtol 1e-5.
#include "kolo/torch/pipeline.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <mutex>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "thread_ranks.h"
#include "torch_harness.h"

namespace kolo {
namespace {

using testing::kTorchTimeout;
using testing::run_ranks;

constexpr int kSteps = 3;
constexpr int64_t kBatch = 10;  // not a multiple of 4 micro-batches: sizes 3, 3, 2, 2
constexpr double kLr = 0.05;

// 8 modules: (N, 6) -> (N, 3).
torch::nn::Sequential make_model(double dropout) {
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(),
                               torch::nn::Dropout(dropout), torch::nn::Linear(16, 16),
                               torch::nn::ReLU(), torch::nn::Linear(16, 12),
                               torch::nn::Dropout(dropout), torch::nn::Linear(12, 3));
}

torch::nn::Sequential copy_of(const torch::nn::Sequential& source, double dropout) {
  auto copy = make_model(dropout);
  torch::NoGradGuard no_grad;
  auto to = copy->parameters();
  auto from = source->parameters();
  for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  return copy;
}

torch::Tensor loss_fn(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::mse_loss(output, target);
}

std::unique_ptr<torch::optim::SGD> sgd(const std::vector<torch::Tensor>& params) {
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(kLr).momentum(0.9));
}

struct Data {
  std::vector<torch::Tensor> x, y;
};

Data make_data() {
  Data d;
  for (int s = 0; s < kSteps; ++s) {
    d.x.push_back(torch::randn({kBatch, 6}));
    d.y.push_back(torch::randn({kBatch, 3}));
  }
  return d;
}

// Rows of each micro-batch (the pipeline's rule: the first B % m get one more).
std::vector<int64_t> micro_sizes(int64_t rows, int m) {
  std::vector<int64_t> sizes;
  for (int k = 0; k < m; ++k) sizes.push_back(rows / m + (k < rows % m ? 1 : 0));
  return sizes;
}

// The unsplit model in one process. Without seed: the whole batch at once.
// With seed: micro-batch by micro-batch, reseeding at each stage's first
// module exactly as the pipeline does (stage_sizes says where), each
// micro-batch's loss scaled by its share of the batch.
std::vector<double> reference_run(torch::nn::Sequential model, const Data& data,
                                  std::optional<uint64_t> seed, int m,
                                  const std::vector<int64_t>& stage_sizes) {
  auto opt = sgd(model->parameters());
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    opt->zero_grad();
    if (!seed) {
      torch::Tensor loss = loss_fn(model->forward(data.x[step]), data.y[step]);
      loss.backward();
      losses.push_back(loss.item<double>());
    } else {
      double total = 0;
      int64_t start = 0;
      const auto sizes = micro_sizes(kBatch, m);
      for (int k = 0; k < m; ++k) {
        torch::Tensor x = data.x[step].narrow(0, start, sizes[k]);
        const torch::Tensor y = data.y[step].narrow(0, start, sizes[k]);
        start += sizes[k];
        int64_t index = 0;
        int stage = 0;
        int64_t stage_end = stage_sizes[0];
        torch::manual_seed(pipeline_seed(*seed, step, k, 0));
        for (auto& module : *model) {
          if (index == stage_end) {
            ++stage;
            stage_end += stage_sizes[stage];
            torch::manual_seed(pipeline_seed(*seed, step, k, stage));
          }
          x = module.forward(x);
          ++index;
        }
        const double share = static_cast<double>(sizes[k]) / kBatch;
        torch::Tensor loss = loss_fn(x, y);
        (loss * share).backward();
        total += loss.item<double>() * share;
      }
      losses.push_back(total);
    }
    opt->step();
  }
  return losses;
}

struct Case {
  PipelineSchedule schedule;
  int stages;
  bool dropout;
};

class PipelineEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineEquivalence, LossAndParametersMatchTheUnsplitModel) {
  const Case c = GetParam();
  const int m = 4;
  const double dropout = c.dropout ? 0.3 : 0.0;
  torch::manual_seed(7);
  const auto init = make_model(dropout);
  const Data data = make_data();
  std::optional<uint64_t> seed;
  if (c.dropout) seed = 1234;

  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < c.stages; ++r) models.push_back(copy_of(init, dropout));
  auto comms = make_thread_communicators(c.stages, kTorchTimeout);
  std::mutex rng_mutex;
  std::vector<double> pipeline_losses;
  std::vector<int64_t> sizes;
  run_ranks(c.stages, [&](int rank) {
    PipelineOptions options;
    options.schedule = c.schedule;
    options.micro_batches = m;
    options.communicator = comms[rank].get();
    options.timeout = kTorchTimeout;
    options.seed = seed;
    options.rng_mutex = &rng_mutex;
    Pipeline pipe(models[rank], options);
    auto opt = sgd(pipe.parameters());
    for (int step = 0; step < kSteps; ++step) {
      opt->zero_grad();
      torch::Tensor loss =
          pipe.train_step(pipe.is_first() ? data.x[step] : torch::Tensor(),
                          pipe.is_last() ? data.y[step] : torch::Tensor(), loss_fn);
      opt->step();
      if (pipe.is_last()) pipeline_losses.push_back(loss.item<double>());
    }
    if (rank == 0) sizes = pipe.stage_sizes();
  });

  auto reference = copy_of(init, dropout);
  const std::vector<double> expected = reference_run(reference, data, seed, m, sizes);
  ASSERT_EQ(pipeline_losses.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(pipeline_losses[i], expected[i], 1e-5 * std::abs(expected[i]) + 1e-7)
        << "step " << i;
  }
  // Every rank kept its stage's modules: together they are the whole model.
  auto expected_params = reference->named_parameters();
  int checked = 0;
  for (int r = 0; r < c.stages; ++r) {
    for (const auto& item : models[r]->named_parameters()) {
      // models[r] still holds every module; only this rank's stage trained.
      const int64_t module = std::stoll(item.key().substr(0, item.key().find('.')));
      int64_t start = 0;
      for (int s = 0; s < r; ++s) start += sizes[s];
      if (module < start || module >= start + sizes[r]) continue;
      const torch::Tensor& want = expected_params[item.key()];
      const torch::Tensor diff = (item.value() - want).abs();
      EXPECT_TRUE(torch::all(diff <= 1e-6 + 1e-4 * want.abs()).item<bool>())
          << item.key() << " on stage " << r << ": max diff " << diff.max().item<double>();
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(expected_params.size()));
}

std::vector<Case> equivalence_cases() {
  std::vector<Case> cases;
  for (auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int stages : {2, 3, 4}) cases.push_back({schedule, stages, false});
    for (int stages : {2, 4}) cases.push_back({schedule, stages, true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineEquivalence, ::testing::ValuesIn(equivalence_cases()),
                         [](const auto& info) {
                           return std::string(pipeline_schedule_name(info.param.schedule)) + "_" +
                                  std::to_string(info.param.stages) + "_stages" +
                                  (info.param.dropout ? "_dropout" : "");
                         });

// ---- memory: micro-batches held between forward and backward -----------------

TEST(PipelineMemory, OneFOneBHoldsAtMostStagesMicroBatchesGPipeAll) {
  constexpr int kStages = 4;
  constexpr int kMicro = 8;
  torch::manual_seed(3);
  const auto init = make_model(0.0);
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < kStages; ++r) models.push_back(copy_of(init, 0.0));
  const torch::Tensor x = torch::randn({kMicro * 4, 6});
  const torch::Tensor y = torch::randn({kMicro * 4, 3});
  std::vector<std::map<PipelineSchedule, Pipeline::Stats>> stats(kStages);
  auto comms = make_thread_communicators(kStages, kTorchTimeout);
  run_ranks(kStages, [&](int rank) {
    for (auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
      PipelineOptions options;
      options.schedule = schedule;
      options.micro_batches = kMicro;
      options.communicator = comms[rank].get();
      options.timeout = kTorchTimeout;
      options.balance = PipelineBalance::kManual;
      options.stage_sizes = {2, 2, 2, 2};
      options.tag = schedule == PipelineSchedule::kGPipe ? 100 : 200;
      Pipeline pipe(models[rank], options);
      pipe.train_step(x, y, loss_fn);
      stats[rank][schedule] = pipe.stats();
    }
  });
  for (int s = 0; s < kStages; ++s) {
    const auto& gpipe = stats[s][PipelineSchedule::kGPipe];
    const auto& one_f = stats[s][PipelineSchedule::k1F1B];
    EXPECT_EQ(gpipe.max_live_micro_batches, kMicro) << "stage " << s;
    EXPECT_EQ(one_f.max_live_micro_batches, kStages - s) << "stage " << s;
    EXPECT_LE(one_f.max_live_micro_batches, kStages);
    // Equal micro-batches: the peak is the count times one micro-batch's bytes.
    EXPECT_EQ(gpipe.peak_activation_bytes * (kStages - s), one_f.peak_activation_bytes * kMicro)
        << "stage " << s;
    EXPECT_GT(one_f.peak_activation_bytes, 0);
  }
}

// ---- partitions ---------------------------------------------------------------

TEST(PipelinePartition, BalanceCostsMinimisesTheLargestStage) {
  EXPECT_EQ(balance_costs({1, 1, 1, 1}, 2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(balance_costs({10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 2), (std::vector<int64_t>{1, 10}));
  EXPECT_EQ(balance_costs({5, 0, 5, 0, 5, 0, 5, 0}, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(balance_costs({1, 2, 3}, 3), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_THROW(balance_costs({1, 2}, 3), ContractError);
  // The model above: Linear 6x16 (112), Tanh, Dropout, Linear 16x16 (272),
  // ReLU, Linear 16x12 (204), Dropout, Linear 12x3 (39): 384 | 243, the ReLU
  // staying with the layer before it.
  const auto sizes = balance_by_parameters(make_model(0.0), 2);
  EXPECT_EQ(sizes, (std::vector<int64_t>{5, 3}));
  const auto timed = balance_by_time(make_model(0.0), 3, torch::randn({8, 6}));
  int64_t total = 0;
  for (int64_t size : timed) {
    EXPECT_GE(size, 1);
    total += size;
  }
  EXPECT_EQ(total, 8);
}

// Builds a Pipeline of `model_of(rank)` with the options `adjust(options,
// rank)` makes, on 3 rank-threads; returns each rank's ContractError
// message ("" = none).
std::vector<std::string> construction_errors(
    const std::function<torch::nn::Sequential(int)>& model_of,
    const std::function<void(PipelineOptions&, int)>& adjust) {
  constexpr int kRanks = 3;
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < kRanks; ++r) models.push_back(model_of(r));
  auto comms = make_thread_communicators(kRanks, kTorchTimeout);
  std::vector<std::string> errors(kRanks);
  run_ranks(kRanks, [&](int rank) {
    PipelineOptions options;
    options.communicator = comms[rank].get();
    options.timeout = kTorchTimeout;
    adjust(options, rank);
    try {
      Pipeline pipe(models[rank], options);
    } catch (const ContractError& e) {
      errors[rank] = e.what();
    }
  });
  return errors;
}

TEST(PipelinePartition, ByHandAndByTimeAgreeOnEveryStage) {
  auto errors = construction_errors([](int) { return make_model(0.0); },
                                    [](PipelineOptions& o, int) {
                                      o.balance = PipelineBalance::kManual;
                                      o.stage_sizes = {3, 1, 4};
                                    });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  errors = construction_errors([](int) { return make_model(0.0); },
                               [](PipelineOptions& o, int) {
                                 o.balance = PipelineBalance::kTime;
                                 o.balance_sample = torch::randn({4, 6});
                               });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(PipelinePartition, BadSizesAreAContractErrorOnEveryRank) {
  const auto errors = construction_errors([](int) { return make_model(0.0); },
                                          [](PipelineOptions& o, int) {
                                            o.balance = PipelineBalance::kManual;
                                            o.stage_sizes = {3, 3, 3};
                                          });
  for (const auto& e : errors)
    EXPECT_NE(e.find("stage sizes do not describe the model"), std::string::npos) << e;
}

TEST(PipelinePartition, ADifferentModelOnOneRankIsAContractErrorOnEveryRank) {
  const auto errors = construction_errors(
      [](int rank) {
        if (rank != 2) return make_model(0.0);
        return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(),
                                     torch::nn::Dropout(0.0), torch::nn::Linear(16, 17),
                                     torch::nn::ReLU(), torch::nn::Linear(17, 12),
                                     torch::nn::Dropout(0.0), torch::nn::Linear(12, 3));
      },
      [](PipelineOptions&, int) {});
  for (const auto& e : errors) {
    EXPECT_NE(e.find("module 3 of stage 2 (rank 2)'s model has 289 parameters"), std::string::npos)
        << e;
  }
}

// Stages that disagree on the step plan would deadlock (another schedule
// sends and receives in another order) or fail inside torch (another
// micro-batch count): construction refuses them on every rank.
TEST(PipelinePartition, ADifferentPlanOnOneRankIsAContractErrorOnEveryRank) {
  auto errors = construction_errors([](int) { return make_model(0.0); },
                                    [](PipelineOptions& o, int rank) {
                                      if (rank == 1) o.schedule = PipelineSchedule::kGPipe;
                                    });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("stage 0 runs the 1f1b schedule, stage 1 (rank 1) runs gpipe"),
              std::string::npos)
        << e;
  }
  errors = construction_errors([](int) { return make_model(0.0); },
                               [](PipelineOptions& o, int rank) {
                                 if (rank == 2) o.micro_batches = 8;
                               });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("stage 0 cuts each batch into 4 micro-batches, stage 2 (rank 2) into 8"),
              std::string::npos)
        << e;
  }
  errors = construction_errors(
      [](int) { return make_model(0.0); },
      [](PipelineOptions& o, int rank) { o.optimizer_averages_micro_batches = rank == 0; });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("optimizer_averages_micro_batches is true on stage 0 and false on stage 1"),
              std::string::npos)
        << e;
  }
}

TEST(PipelineForward, InferenceEqualsTheUnsplitModel) {
  constexpr int kStages = 3;
  torch::manual_seed(11);
  auto init = make_model(0.0);
  std::vector<torch::nn::Sequential> models;
  for (int r = 0; r < kStages; ++r) models.push_back(copy_of(init, 0.0));
  const torch::Tensor x = torch::randn({9, 6});
  torch::Tensor got;
  auto comms = make_thread_communicators(kStages, kTorchTimeout);
  run_ranks(kStages, [&](int rank) {
    PipelineOptions options;
    options.micro_batches = 3;
    options.communicator = comms[rank].get();
    options.timeout = kTorchTimeout;
    Pipeline pipe(models[rank], options);
    torch::Tensor out = pipe.forward(pipe.is_first() ? x : torch::Tensor());
    if (pipe.is_last()) got = out;
  });
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(got, init->forward(x), 1e-5, 1e-6));
}

}  // namespace
}  // namespace kolo
