// kolo::Trainer (kolo/torch/trainer.h) on 2 rank-threads:
//  - fit() with BroadcastGlobalVariables trains exactly as the hand-written
//    Horovod loop (same sampler order, same steps) from ranks that started
//    apart; callbacks are called at Keras' points; logs hold the metrics;
//  - MetricAverage, LearningRateWarmup, CsvLogger, EarlyStopping;
//  - ModelCheckpoint resumes after the saved epoch.
#include "kolo/torch/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kolo/torch/lr.h"
#include "kolo/torch/optimizer_factory.h"
#include "optimizer_harness.h"
#include "temp_dir.h"
#include "torch_harness.h"
#include "zero_harness.h"

namespace kolo {
namespace {

namespace zt = zero_testing;
namespace ot = optimizer_testing;
using testing::run_with_engines;
using zt::factory_options;

constexpr int kWorld = 2;
constexpr int64_t kSamples = 40;
constexpr int64_t kBatch = 4;

struct Data {
  torch::Tensor x = torch::randn({kSamples, 7});
  torch::Tensor y = torch::randint(0, 5, {kSamples}, torch::kLong);
  Dataset set() const {
    return {kSamples, [this](const torch::Tensor& rows) {
              return std::make_pair(x.index_select(0, rows), y.index_select(0, rows));
            }};
  }
};

// Counts the calls it sees.
struct Counter : Callback {
  int train_begin = 0, epoch_begin = 0, batch_begin = 0, batch_end = 0, epoch_end = 0,
      train_end = 0;
  void on_train_begin(Trainer&) override { ++train_begin; }
  void on_epoch_begin(Trainer&, int64_t) override { ++epoch_begin; }
  void on_batch_begin(Trainer&, int64_t) override { ++batch_begin; }
  void on_batch_end(Trainer&, int64_t, Logs& logs) override {
    ++batch_end;
    EXPECT_EQ(logs.count("loss"), 1u);
  }
  void on_epoch_end(Trainer&, int64_t, Logs&) override { ++epoch_end; }
  void on_train_end(Trainer&, Logs&) override { ++train_end; }
};

torch::Tensor cross_entropy(const torch::Tensor& out, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(out, y);
}

TEST(Trainer, FitTrainsAsTheHandWrittenLoopAndCallsEveryCallback) {
  torch::set_num_threads(1);
  torch::manual_seed(41);
  const Data data;
  zt::ZeroNet initial;
  std::vector<std::shared_ptr<zt::ZeroNet>> fitted, by_hand;
  for (int r = 0; r < kWorld; ++r) {
    fitted.push_back(zt::copy_of(initial));
    by_hand.push_back(zt::copy_of(initial));
  }
  // Rank 1 starts elsewhere: BroadcastGlobalVariables(0) must fix it.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : fitted[1]->parameters()) p.add_(1.0);
  }
  testing::TempDir dir("kolo-trainer");
  constexpr int kEpochs = 3;
  run_with_engines(kWorld, [&](int rank, Engine& engine) {
    TrainerOptions options;
    options.engine = &engine;
    options.timeout = testing::kTorchTimeout;
    options.epochs = kEpochs;
    options.batch_size = kBatch;
    options.sampling.seed = 7;
    {
      zt::ZeroNet& model = *fitted[rank];
      torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
      auto optimizer = make_parallel_optimizer(sgd, model, factory_options(0, engine));
      Trainer trainer(
          model, [&](const torch::Tensor& x) { return model.forward(x); }, cross_entropy,
          *optimizer, options);
      auto counter = std::make_shared<Counter>();
      trainer.add(std::make_shared<BroadcastGlobalVariables>(0));
      trainer.add(std::make_shared<MetricAverage>());
      LrScheduleOptions warmup;
      warmup.base_lr = 0.05;
      warmup.peak_lr = 0.1;
      warmup.warmup_epochs = 1;
      trainer.add(std::make_shared<LearningRateWarmup>(warmup));
      trainer.add(std::make_shared<CsvLogger>(dir.file("log.csv")));
      trainer.add(counter);
      const Dataset train = data.set();
      const Logs logs = trainer.fit(train, &train);
      for (const char* key : {"loss", "accuracy", "val_loss", "val_accuracy", "lr"}) {
        EXPECT_EQ(logs.count(key), 1u) << key;
      }
      EXPECT_DOUBLE_EQ(logs.at("lr"), 0.1);
      const int64_t steps = kSamples / kWorld / kBatch;
      EXPECT_EQ(trainer.steps_per_epoch(), steps);
      EXPECT_EQ(counter->train_begin, 1);
      EXPECT_EQ(counter->epoch_begin, kEpochs);
      EXPECT_EQ(counter->batch_begin, kEpochs * steps);
      EXPECT_EQ(counter->batch_end, kEpochs * steps);
      EXPECT_EQ(counter->epoch_end, kEpochs);
      EXPECT_EQ(counter->train_end, 1);
    }
    {
      // The same by hand: Horovod's loop with the same sampler and rates.
      zt::ZeroNet& model = *by_hand[rank];
      torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(0.1));
      auto optimizer = make_parallel_optimizer(sgd, model, factory_options(0, engine));
      DistributedSamplerOptions sampling;
      sampling.seed = 7;
      sampling.rank = rank;
      sampling.size = kWorld;
      DistributedSampler sampler(kSamples, sampling);
      const int64_t steps = kSamples / kWorld / kBatch;
      LrScheduleOptions warmup;
      warmup.base_lr = 0.05;
      warmup.peak_lr = 0.1;
      warmup.warmup_epochs = 1;
      warmup.steps_per_epoch = steps;
      const LrSchedule schedule(warmup);
      for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
        sampler.set_epoch(epoch);
        for (int64_t step = 0; step < steps; ++step) {
          std::vector<int64_t> rows;
          for (int64_t i = 0; i < kBatch; ++i) {
            rows.push_back(static_cast<int64_t>(sampler.indices()[step * kBatch + i]));
          }
          const torch::Tensor index = torch::tensor(rows, torch::kLong);
          apply_lr(sgd, schedule.lr(epoch, step));
          optimizer->zero_grad();
          cross_entropy(model.forward(data.x.index_select(0, index)), data.y.index_select(0, index))
              .backward();
          optimizer->step();
        }
      }
    }
    ot::finish(engine);
  });
  for (int r = 0; r < kWorld; ++r) {
    ot::expect_params_close(*fitted[r], *by_hand[0], 1e-6, 1e-7, "rank " + std::to_string(r));
  }
  std::ifstream csv(dir.file("log.csv"));
  std::string header, line;
  std::getline(csv, header);
  EXPECT_EQ(header, "epoch,accuracy,loss,lr,val_accuracy,val_loss");
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, kEpochs);
}

TEST(Trainer, EarlyStoppingAndModelCheckpointResume) {
  torch::set_num_threads(1);
  torch::manual_seed(42);
  const Data data;
  zt::ZeroNet initial;
  testing::TempDir dir("kolo-trainer-ckpt");
  run_with_engines(kWorld, [&](int rank, Engine& engine) {
    TrainerOptions options;
    options.engine = &engine;
    options.timeout = testing::kTorchTimeout;
    options.batch_size = kBatch;
    const Dataset train = data.set();
    const auto make = [&](zt::ZeroNet& model, torch::optim::Optimizer& inner, int stage) {
      return make_parallel_optimizer(inner, model, factory_options(stage, engine));
    };
    {
      // Loss falls every epoch, so in "max" mode it never improves after the first.
      auto model = zt::copy_of(initial);
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05));
      auto optimizer = make(*model, sgd, 2);
      options.epochs = 5;
      Trainer trainer(
          *model, [&](const torch::Tensor& x) { return model->forward(x); }, cross_entropy,
          *optimizer, options);
      auto stop = std::make_shared<EarlyStopping>("loss", 1, 0.0, "max");
      trainer.add(stop);
      trainer.add(std::make_shared<ModelCheckpoint>(dir.file("ckpt")));
      trainer.fit(train);
      EXPECT_EQ(stop->stopped_epoch(), 2);
      EXPECT_TRUE(trainer.stop_training);
    }
    {
      // Resumes after the checkpoint's 3 epochs: 2 more to reach 5.
      auto model = zt::copy_of(initial);
      torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05));
      auto optimizer = make(*model, sgd, 1);
      Trainer trainer(
          *model, [&](const torch::Tensor& x) { return model->forward(x); }, cross_entropy,
          *optimizer, options);
      auto counter = std::make_shared<Counter>();
      trainer.add(std::make_shared<ModelCheckpoint>(dir.file("ckpt"), /*resume=*/true));
      trainer.add(counter);
      trainer.fit(train);
      EXPECT_EQ(counter->epoch_begin, 2);
    }
    ot::finish(engine);
  });
  EXPECT_NE(testing::error_of([] {
              EarlyStopping bad("loss", 0, 0, "sideways");
            }).find("use \"min\" or \"max\""),
            std::string::npos);
}

}  // namespace
}  // namespace kolo
