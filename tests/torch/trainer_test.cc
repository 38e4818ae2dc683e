// kolo::Trainer (kolo/torch/trainer.h) on 2 rank-threads:
//  - fit() with BroadcastGlobalVariables and LearningRateWarmup trains
//    exactly as the hand-written Horovod loop (same sampler order, same
//    steps, same rates) from ranks that started apart; callbacks are called
//    at Keras' points; logs hold the metrics; CsvLogger writes them;
//  - with options.balance, fit() equals one process on each global batch;
//  - train_on_batch is one step of the hand-written loop; evaluate() leaves
//    the model in the mode it found;
//  - BroadcastGlobalVariables(root 1), MetricAverage, LearningRateSchedule,
//    Throughput and ProgressBar (their lines, rank 0 only), EarlyStopping
//    (the same decision on every rank from different logs);
//  - a LossScaler: an inf on one rank skips that step on every rank, the
//    others train as without it, and ModelCheckpoint keeps the scale;
//  - ModelCheckpoint: a run stopped early and resumed (at another ZeRO
//    stage) ends where an uninterrupted run ends; kRequired without a
//    checkpoint names the file, kIfPresent starts afresh.
#include "kolo/torch/trainer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kolo/torch/lr.h"
#include "kolo/torch/metrics.h"
#include "kolo/torch/optimizer_factory.h"
#include "optimizer_harness.h"
#include "temp_dir.h"
#include "torch_harness.h"
#include "trainer_harness.h"
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

struct Data : testing::ClassificationData {
  Data() : ClassificationData(kSamples) {}
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
      sampling.world_size = kWorld;
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
  // The same operations in the same order: equal to the bit.
  for (int r = 0; r < kWorld; ++r) {
    ot::expect_params_close(*fitted[r], *by_hand[0], 0, 0, "rank " + std::to_string(r));
  }
  std::ifstream csv(dir.file("log.csv"));
  std::string header, line;
  std::getline(csv, header);
  EXPECT_EQ(header, "epoch,accuracy,loss,lr,val_accuracy,val_loss");
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, kEpochs);
}

// Builds a trainer over a fresh copy of `initial` for one rank.
struct TrainerRun {
  std::shared_ptr<zt::ZeroNet> model;
  std::unique_ptr<torch::optim::SGD> sgd;
  std::unique_ptr<ParallelOptimizer> optimizer;
  std::unique_ptr<Trainer> trainer;
  TrainerRun(const zt::ZeroNet& initial, Engine& engine, TrainerOptions options, int stage = 0,
             double lr = 0.05, Trainer::Loss loss = cross_entropy)
      : model(zt::copy_of(initial)),
        sgd(std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(lr))),
        optimizer(make_parallel_optimizer(*sgd, *model, factory_options(stage, engine))) {
    options.engine = &engine;
    options.timeout = testing::kTorchTimeout;
    auto* net = model.get();
    trainer = std::make_unique<Trainer>(
        *model, [net](const torch::Tensor& x) { return net->forward(x); }, std::move(loss),
        *optimizer, options);
  }
};

// A CsvLogger whose path is not a regular file writes into it and leaves it
// what it was: renaming its temporary file over /dev/null, run as root, had
// made /dev/null a regular file for every process on the machine. A FIFO
// stands in for the device (the test never touches /dev/null).
TEST(Trainer, CsvLoggerWritesIntoAFifoAndLeavesItAFifo) {
  torch::set_num_threads(1);
  torch::manual_seed(43);
  const Data data;
  zt::ZeroNet initial;
  testing::TempDir dir("kolo-trainer-fifo");
  const std::string fifo = dir.file("log.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  // Held open for reading and writing, the FIFO never blocks the logger's
  // open, and its buffer (64 KiB) holds every row until they are read below.
  const int fd = open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  constexpr int kEpochs = 2;
  run_with_engines(1, [&](int, Engine& engine) {
    TrainerOptions options;
    options.epochs = kEpochs;
    options.batch_size = kBatch;
    TrainerRun run(initial, engine, options);
    run.trainer->add(std::make_shared<CsvLogger>(fifo));
    run.trainer->fit(data.set());
    ot::finish(engine);
  });
  std::string received(4096, '\0');
  const ssize_t got = read(fd, received.data(), received.size());
  close(fd);
  received.resize(got > 0 ? static_cast<size_t>(got) : 0);
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  EXPECT_FALSE(std::filesystem::exists(fifo + ".tmp"));
  EXPECT_EQ(received.rfind("epoch,accuracy,loss\n0,", 0), 0u) << received;
  EXPECT_EQ(std::count(received.begin(), received.end(), '\n'), kEpochs + 1) << received;
}

TEST(Trainer, BalancedFitEqualsOneProcessOnEachGlobalBatch) {
  torch::set_num_threads(1);
  torch::manual_seed(43);
  const Data data;
  zt::ZeroNet initial;
  std::vector<std::shared_ptr<zt::ZeroNet>> fitted(kWorld);
  run_with_engines(kWorld, [&](int rank, Engine& engine) {
    TrainerOptions options;
    options.epochs = 2;
    options.batch_size = kBatch;
    options.sampling.seed = 3;
    options.balance = true;
    TrainerRun run(initial, engine, options);
    run.trainer->fit(data.set());
    EXPECT_EQ(run.trainer->steps_per_epoch(), kSamples / (kBatch * kWorld));
    ASSERT_NE(run.trainer->balancer(), nullptr);
    EXPECT_EQ(run.trainer->balancer()->global_batch(), kBatch * kWorld);
    fitted[rank] = run.model;
    ot::finish(engine);
  });
  // One process, the global batches in the order of a sampler of one rank.
  auto alone = zt::copy_of(initial);
  torch::optim::SGD sgd(alone->parameters(), torch::optim::SGDOptions(0.05));
  DistributedSamplerOptions sampling;
  sampling.seed = 3;
  sampling.rank = 0;
  sampling.world_size = 1;
  DistributedSampler sampler(kSamples, sampling);
  const int64_t global = kBatch * kWorld;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    sampler.set_epoch(epoch);
    for (int64_t step = 0; step < kSamples / global; ++step) {
      std::vector<int64_t> rows(sampler.indices().begin() + step * global,
                                sampler.indices().begin() + (step + 1) * global);
      const torch::Tensor index = torch::tensor(rows, torch::kLong);
      sgd.zero_grad();
      cross_entropy(alone->forward(data.x.index_select(0, index)), data.y.index_select(0, index))
          .backward();
      sgd.step();
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    ot::expect_params_close(*fitted[r], *alone, 1e-5, 1e-6, "rank " + std::to_string(r));
  }
}

// The split rule as a free function (what a parameter server saves by):
// the sampler's shard over the batch, or whole global batches with balance;
// numbers it cannot divide by are a ContractError naming them.
TEST(Trainer, StepsPerEpochIsTheSplitRuleAndRefusesZeros) {
  TrainerOptions options;
  options.batch_size = 16;
  EXPECT_EQ(steps_per_epoch(100, 3, options), 3);  // shard ceil(100 / 3) = 34, 34 / 16 -> 3
  options.sampling.drop_last = true;
  EXPECT_EQ(steps_per_epoch(100, 3, options), 3);  // shard 33 -> 3
  EXPECT_EQ(steps_per_epoch(96, 3, options), 2);   // shard 32 -> 2
  options.balance = true;
  EXPECT_EQ(steps_per_epoch(100, 3, options), 2);  // floor(100 / 48)
  EXPECT_EQ(steps_per_epoch(0, 3, options), 0);
  const std::string no_world = testing::error_of([&] { steps_per_epoch(100, 0, options); });
  EXPECT_NE(no_world.find("world_size >= 1"), std::string::npos) << no_world;
  EXPECT_NE(no_world.find("got 100, 0 and 16"), std::string::npos) << no_world;
  options.batch_size = 0;
  EXPECT_NE(testing::error_of([&] { steps_per_epoch(100, 2, options); }).find("batch_size >= 1"),
            std::string::npos);
  options.batch_size = 16;
  EXPECT_NE(testing::error_of([&] { steps_per_epoch(-1, 2, options); }).find("got -1, 2 and 16"),
            std::string::npos);
}

TEST(Trainer, TrainOnBatchIsOneStepAndEvaluateKeepsTheModelsMode) {
  torch::set_num_threads(1);
  torch::manual_seed(47);
  const Data data;
  zt::ZeroNet initial;
  std::vector<std::shared_ptr<zt::ZeroNet>> stepped(kWorld), by_hand(kWorld);
  std::vector<Logs> logs(kWorld);
  run_with_engines(kWorld, [&](int rank, Engine& engine) {
    const torch::Tensor rows = torch::arange(rank * kBatch, (rank + 1) * kBatch, torch::kLong);
    const torch::Tensor x = data.x.index_select(0, rows), y = data.y.index_select(0, rows);
    TrainerRun run(initial, engine, {});
    logs[rank] = run.trainer->train_on_batch(x, y);
    EXPECT_TRUE(run.model->is_training());
    run.trainer->evaluate(data.set());
    EXPECT_TRUE(run.model->is_training());  // as before evaluate()
    run.model->eval();
    run.trainer->evaluate(data.set());
    EXPECT_FALSE(run.model->is_training());
    stepped[rank] = run.model;
    TrainerRun hand(initial, engine, {});
    hand.optimizer->zero_grad();
    cross_entropy(hand.model->forward(x), y).backward();
    hand.optimizer->step();
    by_hand[rank] = hand.model;
    ot::finish(engine);
  });
  for (int r = 0; r < kWorld; ++r) {
    ot::expect_params_close(*stepped[r], *by_hand[0], 0, 0, "rank " + std::to_string(r));
    EXPECT_EQ(logs[r].count("loss"), 1u);
    EXPECT_EQ(logs[r].count("accuracy"), 1u);
  }
}

// Puts a rank-dependent metric in the logs and records what it sees.
struct Probe : Callback {
  std::string key;
  std::function<double(int rank, int64_t epoch)> value;
  std::vector<double> lrs;  // the rate at each batch begin
  void on_batch_begin(Trainer& trainer, int64_t) override {
    lrs.push_back(current_lr(trainer.optimizer().optimizer()));
  }
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override {
    if (value) logs[key] = value(trainer.rank(), epoch);
  }
};

TEST(Trainer, CallbacksDoWhatTheirNamesSay) {
  torch::set_num_threads(1);
  torch::manual_seed(44);
  const Data data;
  zt::ZeroNet initial;
  std::vector<zt::ZeroNet> starts(kWorld);  // each rank's own start
  std::vector<std::shared_ptr<zt::ZeroNet>> after_broadcast(kWorld);
  std::vector<Logs> last(kWorld);
  std::vector<std::vector<double>> lrs(kWorld);
  ::testing::internal::CaptureStdout();
  run_with_engines(kWorld, [&](int rank, Engine& engine) {
    {
      // BroadcastGlobalVariables(1): every rank takes rank 1's parameters.
      TrainerOptions options;
      options.epochs = 0;  // on_train_begin only
      TrainerRun run(starts[rank], engine, options);
      run.trainer->add(std::make_shared<BroadcastGlobalVariables>(1));
      run.trainer->fit(data.set());
      after_broadcast[rank] = run.model;
    }
    TrainerOptions options;
    options.epochs = 2;
    options.batch_size = kBatch;
    TrainerRun run(initial, engine, options, 0, 0.08);
    auto probe = std::make_shared<Probe>();
    probe->key = "rank";
    probe->value = [](int r, int64_t) { return static_cast<double>(r); };
    run.trainer->add(probe);  // before MetricAverage: averaged
    run.trainer->add(std::make_shared<MetricAverage>());
    run.trainer->add(std::make_shared<LearningRateSchedule>(
        [](int64_t epoch, double lr) { return epoch == 0 ? lr : lr / 4; }));
    run.trainer->add(std::make_shared<ProgressBar>(2));
    run.trainer->add(std::make_shared<Throughput>());
    last[rank] = run.trainer->fit(data.set(), nullptr);
    lrs[rank] = probe->lrs;
    ot::finish(engine);
  });
  const std::string out = ::testing::internal::GetCapturedStdout();
  for (int r = 0; r < kWorld; ++r) {
    ot::expect_params_close(*after_broadcast[r], starts[1], 0, 0, "rank " + std::to_string(r));
    // MetricAverage: the mean over the ranks, on every rank; so is the loss.
    EXPECT_DOUBLE_EQ(last[r].at("rank"), 0.5);
    EXPECT_DOUBLE_EQ(last[r].at("loss"), last[0].at("loss"));
    // LearningRateSchedule: 0.08 in epoch 0, 0.02 in epoch 1.
    const int64_t steps = kSamples / kWorld / kBatch;
    ASSERT_EQ(lrs[r].size(), static_cast<size_t>(2 * steps));
    EXPECT_DOUBLE_EQ(lrs[r].front(), 0.08);
    EXPECT_DOUBLE_EQ(lrs[r].back(), 0.02);
    EXPECT_DOUBLE_EQ(last[r].at("lr"), 0.02);
    // Throughput: every rank's images.
    EXPECT_DOUBLE_EQ(last[r].at("images"), static_cast<double>(kSamples));
    EXPECT_GT(last[r].at("images_per_sec"), 0);
  }
  // Rank 0 alone prints: each line once per epoch.
  const auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("Epoch 1/2\n"), 1u) << out;
  EXPECT_EQ(count("Epoch 2/2\n"), 1u) << out;
  EXPECT_EQ(count("Epoch time: "), 2u) << out;
  EXPECT_EQ(count("Images/sec: "), 2u) << out;
  EXPECT_EQ(count(" (2 worker(s), "), 2u) << out;
  EXPECT_EQ(count("2/5 [============>.................] - ETA: "), 2u) << out;
  EXPECT_EQ(count("5/5 [==============================] - "), 2u) << out;
  EXPECT_EQ(count("ms/step - loss: "), 6u) << out;  // 2 lines per epoch and the last
}

TEST(Trainer, EarlyStoppingDecidesAlikeOnEveryRank) {
  torch::set_num_threads(1);
  torch::manual_seed(45);
  const Data data;
  zt::ZeroNet initial;
  std::vector<int64_t> stopped(kWorld, -2), epochs_run(kWorld, 0);
  run_with_engines(kWorld, [&](int rank, Engine& engine) {
    TrainerOptions options;
    options.epochs = 6;
    options.batch_size = kBatch;
    TrainerRun run(initial, engine, options);
    // Rank 0's metric improves every epoch, rank 1's worsens faster: alone,
    // rank 0 would never stop; their mean worsens from epoch 1 on.
    auto probe = std::make_shared<Probe>();
    probe->key = "m";
    probe->value = [](int r, int64_t epoch) {
      return r == 0 ? -static_cast<double>(epoch) : 3.0 * static_cast<double>(epoch);
    };
    auto stop = std::make_shared<EarlyStopping>("m", /*patience=*/1, 0.0, "min");
    run.trainer->add(probe);
    run.trainer->add(stop);
    auto counter = std::make_shared<Counter>();
    run.trainer->add(counter);
    run.trainer->fit(data.set());
    stopped[rank] = stop->stopped_epoch();
    epochs_run[rank] = counter->epoch_end;
    EXPECT_TRUE(run.trainer->stop_training);
    ot::finish(engine);
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(stopped[r], 2) << "rank " << r;  // best at 0; worse at 1 (wait 1), 2 (wait 2 > 1)
    EXPECT_EQ(epochs_run[r], 3) << "rank " << r;
  }
  EXPECT_NE(testing::error_of([] {
              EarlyStopping bad("loss", 0, 0, "sideways");
            }).find("use \"min\" or \"max\""),
            std::string::npos);
}

TEST(Trainer, ModelCheckpointResumesWhereTheRunStopped) {
  torch::set_num_threads(1);
  torch::manual_seed(42);
  const Data data;
  zt::ZeroNet initial;
  testing::TempDir dir("kolo-trainer-ckpt");
  using Resume = ModelCheckpointOptions::Resume;
  std::vector<std::shared_ptr<zt::ZeroNet>> whole(kWorld), resumed(kWorld);
  std::vector<std::string> missing(kWorld);
  run_with_engines(kWorld, [&](int rank, Engine& engine) {
    TrainerOptions options;
    options.batch_size = kBatch;
    options.sampling.seed = 5;
    options.epochs = 5;
    {
      TrainerRun run(initial, engine, options);
      run.trainer->fit(data.set());
      whole[rank] = run.model;
    }
    {
      // Stops after 3 epochs (a job killed), saving each at ZeRO stage 2;
      // kIfPresent finds nothing yet and starts at epoch 0.
      TrainerRun run(initial, engine, options, 2);
      run.trainer->add(std::make_shared<ModelCheckpoint>(
          ModelCheckpointOptions{dir.file("ckpt"), Resume::kIfPresent}));
      auto counter = std::make_shared<Counter>();
      run.trainer->add(counter);
      run.trainer->add(std::make_shared<LearningRateSchedule>([&](int64_t epoch, double lr) {
        if (epoch == 2) run.trainer->stop_training = true;
        return lr;
      }));
      run.trainer->fit(data.set());
      EXPECT_EQ(counter->epoch_end, 3);
    }
    {
      // Resumes at stage 1 for the last 2 epochs.
      TrainerRun run(initial, engine, options, 1);
      run.trainer->add(std::make_shared<ModelCheckpoint>(
          ModelCheckpointOptions{dir.file("ckpt"), Resume::kRequired}));
      auto counter = std::make_shared<Counter>();
      run.trainer->add(counter);
      run.trainer->fit(data.set());
      EXPECT_EQ(counter->epoch_begin, 2);
      resumed[rank] = run.model;
    }
    {
      TrainerRun run(initial, engine, options);
      run.trainer->add(std::make_shared<ModelCheckpoint>(
          ModelCheckpointOptions{dir.file("none"), Resume::kRequired}));
      missing[rank] = testing::error_of([&] { run.trainer->fit(data.set()); });
    }
    ot::finish(engine);
  });
  for (int r = 0; r < kWorld; ++r) {
    ot::expect_params_close(*resumed[r], *whole[0], 1e-5, 1e-6, "rank " + std::to_string(r));
    EXPECT_NE(missing[r].find(dir.file("none")), std::string::npos) << missing[r];
  }
}

// A checkpoint directory the saves cannot write is an error on every rank at
// train begin, naming the rank and the directory, not after the first epoch.
// At ZeRO stage 1 every rank writes, so rank 1's bad directory fails rank 0
// too; at stage 0 only rank 0 writes, so rank 1's is never touched. (Run as
// root, a mode of 0500 would not stop a write: the directory's parent is a
// regular file instead.)
TEST(Trainer, ModelCheckpointRefusesAnUnwritableDirectoryBeforeTheFirstEpoch) {
  torch::set_num_threads(1);
  torch::manual_seed(44);
  const Data data;
  zt::ZeroNet initial;
  testing::TempDir dir("kolo-trainer-ckpt-ro");
  const std::string file = dir.file("a-file");
  std::ofstream(file) << "not a directory\n";
  const std::string bad = file + "/ckpt";
  std::vector<std::string> errors(kWorld);
  std::vector<int> epochs(kWorld, -1), stage0_epochs(kWorld, -1);
  run_with_engines(kWorld, [&](int rank, Engine& engine) {
    TrainerOptions options;
    options.batch_size = kBatch;
    options.epochs = 1;
    {
      TrainerRun run(initial, engine, options, 1);
      run.trainer->add(std::make_shared<ModelCheckpoint>(
          ModelCheckpointOptions{rank == 1 ? bad : dir.file("zero")}));
      auto counter = std::make_shared<Counter>();
      run.trainer->add(counter);
      errors[rank] = testing::error_of([&] { run.trainer->fit(data.set()); });
      epochs[rank] = counter->epoch_begin;
    }
    {
      TrainerRun run(initial, engine, options, 0);
      run.trainer->add(std::make_shared<ModelCheckpoint>(
          ModelCheckpointOptions{rank == 1 ? bad : dir.file("plain")}));
      auto counter = std::make_shared<Counter>();
      run.trainer->add(counter);
      run.trainer->fit(data.set());
      stage0_epochs[rank] = counter->epoch_end;
    }
    ot::finish(engine);
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(errors[r].find("kolo::ModelCheckpoint failed on rank 1"), std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("cannot create the checkpoint directory '" + bad + "'"),
              std::string::npos)
        << errors[r];
    EXPECT_EQ(epochs[r], 0) << "rank " << r;
    EXPECT_EQ(stage0_epochs[r], 1) << "rank " << r;
  }
  EXPECT_TRUE(std::filesystem::exists(dir.file("plain") + "/index.kolo"));
}

TEST(Trainer, LossScalingSkipsAnOverflowOnEveryRankAndCheckpointsTheScale) {
  torch::set_num_threads(1);
  torch::manual_seed(46);
  const Data data;
  zt::ZeroNet initial;
  testing::TempDir dir("kolo-trainer-scaler");
  constexpr int64_t kPoisoned = 3;  // rank 1's loss at this step (of epoch 0) is inf
  std::vector<std::shared_ptr<zt::ZeroNet>> scaled(kWorld), by_hand(kWorld);
  std::vector<LossScaler> scalers(kWorld);
  std::vector<double> restored(kWorld);
  run_with_engines(kWorld, [&](int rank, Engine& engine) {
    LossScalerOptions scaling;
    scaling.engine = &engine;
    scaling.init_scale = 1024;
    scalers[rank] = LossScaler(scaling);
    {
      TrainerOptions options;
      options.batch_size = kBatch;
      options.loss_scaler = &scalers[rank];
      int64_t step = 0;
      TrainerRun run(initial, engine, options, 0, 0.05,
                     [&](const torch::Tensor& out, const torch::Tensor& y) {
                       const bool poison = rank == 1 && step++ == kPoisoned;
                       return cross_entropy(out, y) * (poison ? INFINITY : 1.0f);
                     });
      run.trainer->add(std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{dir.file("ckpt")}));
      run.trainer->fit(data.set());
      scaled[rank] = run.model;
    }
    {
      // By hand: the same steps without the poisoned one, unscaled.
      TrainerRun run(initial, engine, {});
      DistributedSamplerOptions sampling;
      sampling.rank = rank;
      sampling.world_size = kWorld;
      DistributedSampler sampler(kSamples, sampling);
      sampler.set_epoch(0);
      for (int64_t step = 0; step < kSamples / kWorld / kBatch; ++step) {
        if (step == kPoisoned) continue;
        std::vector<int64_t> rows(sampler.indices().begin() + step * kBatch,
                                  sampler.indices().begin() + (step + 1) * kBatch);
        const torch::Tensor index = torch::tensor(rows, torch::kLong);
        run.optimizer->zero_grad();
        cross_entropy(run.model->forward(data.x.index_select(0, index)),
                      data.y.index_select(0, index))
            .backward();
        run.optimizer->step();
      }
      by_hand[rank] = run.model;
    }
    {
      // A resumed run's scaler takes the saved scale.
      LossScaler fresh(scaling);
      TrainerOptions options;
      options.batch_size = kBatch;
      options.epochs = 2;
      options.loss_scaler = &fresh;
      TrainerRun run(initial, engine, options);
      run.trainer->add(std::make_shared<ModelCheckpoint>(
          ModelCheckpointOptions{dir.file("ckpt"), ModelCheckpointOptions::Resume::kRequired}));
      auto restore_probe = std::make_shared<Probe>();
      run.trainer->add(restore_probe);
      run.trainer->fit(data.set());
      // Epoch 1 only.
      ASSERT_EQ(restore_probe->lrs.size(), static_cast<size_t>(kSamples / kWorld / kBatch));
      restored[rank] = fresh.skipped_steps() == 0 ? fresh.scale_value() : -1;
    }
    ot::finish(engine);
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(scalers[r].skipped_steps(), 1) << "rank " << r;
    EXPECT_DOUBLE_EQ(scalers[r].scale_value(), 512) << "rank " << r;
    EXPECT_DOUBLE_EQ(restored[r], 512) << "rank " << r;
    // Scaling by a power of two and back is exact in float32.
    ot::expect_params_close(*scaled[r], *by_hand[0], 0, 0, "rank " + std::to_string(r));
  }
}

}  // namespace
}  // namespace kolo
