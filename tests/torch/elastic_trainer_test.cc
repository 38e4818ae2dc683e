// An elastic kolo::Trainer::fit (TrainerOptions::elastic, a
// kolo::elastic::TrainerState) on rank-threads, without kolorun: the test
// plays kolo::elastic::run's part (each rank's state talks to its thread
// communicator; after the "fault" the survivors restore, sync from rank 0
// and train again in a smaller world, as run() does for them).
//  - 3 ranks lose one mid-epoch (every rank leaves at the same batch, as a
//    RuntimeFault from the dead peer's collective makes them); the 2
//    survivors re-form, re-shard the rest of the epoch and finish. Their
//    final model equals, bit for bit, a fresh 2-rank fit started from the
//    same commit (load_commit), the rate rescaled by 2/3 in both (scale_lr),
//    the epoch's logs equal and covering every sample once;
//  - callbacks see on_train_begin once, then on_reset in every new world,
//    with their committed state back (save_state / load_state);
//  - a TrainerState's commit round trip: totals, position, loss scale and
//    callbacks' state come back; a TorchState's commit does not fit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/torch/elastic.h"
#include "kolo/torch/lr.h"
#include "kolo/torch/mixed_precision.h"
#include "kolo/torch/optimizer_factory.h"
#include "kolo/torch/trainer.h"
#include "optimizer_harness.h"
#include "temp_dir.h"
#include "test_net.h"
#include "torch_harness.h"
#include "trainer_harness.h"
#include "zero_harness.h"

namespace kolo {
namespace {

namespace zt = zero_testing;
namespace ot = optimizer_testing;
using testing::kTorchTimeout;
using testing::model_bytes;
using testing::ThreadEngines;

constexpr int64_t kSamples = 48;
constexpr int64_t kBatch = 4;  // 3 ranks: 4 steps an epoch; 2 ranks: 6
constexpr double kLr = 0.05;

struct Data : testing::ClassificationData {
  Data() : ClassificationData(kSamples) {}
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct SimulatedFault : std::runtime_error {
  SimulatedFault() : std::runtime_error("a peer died") {}
};

// Counts the calls, keeps a committed count of batches, records each
// epoch's logs and the rate at each reset; with fail_at set, throws at that
// batch of epoch 0 (every rank at the same one).
struct Probe : Callback {
  int train_begin = 0, reset = 0;
  int64_t batches = 0;  // committed (save_state)
  int64_t fail_at = -1;
  double lr_at_reset = 0;
  std::vector<Logs> epochs;
  void on_train_begin(Trainer&) override { ++train_begin; }
  void on_reset(Trainer& trainer) override {
    ++reset;
    lr_at_reset = current_lr(trainer.optimizer().optimizer());
  }
  void on_batch_begin(Trainer& trainer, int64_t step) override {
    if (trainer.epoch() == 0 && step == fail_at) {
      fail_at = -1;
      throw SimulatedFault();
    }
  }
  void on_batch_end(Trainer&, int64_t, Logs&) override { ++batches; }
  void on_epoch_end(Trainer& trainer, int64_t, Logs& logs) override {
    Logs copy = logs;
    copy["samples"] = trainer.options().elastic->totals().samples;
    epochs.push_back(copy);
  }
  State save_state() const override { return {{"batches", std::to_string(batches)}}; }
  void load_state(const State& state) override { batches = std::stoll(state.at("batches")); }
};

// One rank of an elastic job: the model, SGD with momentum (its state is
// committed too), the state and the callbacks; round() is one world's fit.
struct Member {
  // `csv`: where rank 0's CsvLogger writes (a temporary directory's file).
  Member(const zt::ZeroNet& initial, Communicator* world, const std::string& csv_path)
      : model(zt::copy_of(initial)),
        sgd(model->parameters(), torch::optim::SGDOptions(kLr).momentum(0.9)),
        state(*model, sgd, kSamples, options_for(world)),
        probe(std::make_shared<Probe>()),
        csv(std::make_shared<CsvLogger>(csv_path)) {}
  static elastic::TrainerState::Options options_for(Communicator* world) {
    elastic::TrainerState::Options o;
    o.world = world;
    o.commit_every = 2;
    o.scale_lr = true;
    o.sampling.seed = 7;
    return o;
  }
  // One world's fit of `epochs` (with `scaler` as TrainerOptions::loss_scaler),
  // with the probe, the CSV logger and `extra`.
  Logs round(Engine& engine, int64_t epochs = 2, LossScaler* scaler = nullptr,
             std::shared_ptr<Callback> extra = nullptr) {
    const auto optimizer = make_parallel_optimizer(sgd, *model, zt::factory_options(0, engine));
    TrainerOptions options;
    options.engine = &engine;
    options.timeout = kTorchTimeout;
    options.epochs = epochs;
    options.batch_size = kBatch;
    options.sampling.seed = 7;
    options.loss_scaler = scaler;
    options.elastic = &state;
    auto* net = model.get();
    Trainer trainer(
        *model, [net](const torch::Tensor& x) { return net->forward(x); },
        [](const torch::Tensor& out, const torch::Tensor& y) {
          return torch::nn::functional::cross_entropy(out, y);
        },
        *optimizer, options);
    trainer.add(probe);
    trainer.add(csv);
    if (extra) trainer.add(extra);
    return trainer.fit(data->set());
  }
  std::shared_ptr<zt::ZeroNet> model;
  torch::optim::SGD sgd;
  elastic::TrainerState state;
  std::shared_ptr<Probe> probe;
  std::shared_ptr<CsvLogger> csv;
  const Data* data = nullptr;
};

TEST(ElasticTrainer, ALostRankMidEpochReformsAndEndsAsARestartFromTheCommit) {
  torch::set_num_threads(1);
  torch::manual_seed(11);
  const Data data;
  zt::ZeroNet initial;
  // Models made here: ranks as threads share torch's default generator.
  std::vector<std::unique_ptr<Member>> members, fresh;
  testing::TempDir dir("kolo-elastic-trainer");
  auto state_comms3 = make_thread_communicators(3, kTorchTimeout);
  auto state_comms2 = make_thread_communicators(2, kTorchTimeout);
  auto fresh_comms = make_thread_communicators(2, kTorchTimeout);
  for (int r = 0; r < 3; ++r) {
    members.push_back(std::make_unique<Member>(initial, state_comms3[r].get(),
                                               dir.file("elastic" + std::to_string(r) + ".csv")));
    members.back()->data = &data;
    members.back()->probe->fail_at = 3;  // epoch 0 committed at batch 2, batch 3 never is
  }
  for (int r = 0; r < 2; ++r) {
    fresh.push_back(std::make_unique<Member>(initial, fresh_comms[r].get(),
                                             dir.file("restart" + std::to_string(r) + ".csv")));
    fresh.back()->data = &data;
  }
  ThreadEngines three(3), two(2), restart(2);
  std::vector<Bytes> commits(3);
  std::vector<Logs> last(2);
  testing::run_ranks(3, [&](int rank) {
    Member& m = *members[rank];
    {
      std::unique_ptr<Engine> engine = three.engine(rank);
      EXPECT_THROW(m.round(*engine), SimulatedFault);
      EXPECT_EQ(m.state.epoch, 0);
      EXPECT_EQ(m.state.batch, 3);  // one batch past the last commit
      commits[rank] = m.state.committed();
      ot::finish(*engine);
    }
    if (rank == 2) return;  // the lost rank
    // What elastic::run does in the new world: back to the last commit,
    // rank 0's state for everyone, then the training function again.
    m.state.set_world(state_comms2[rank].get());
    m.state.restore();
    m.state.sync(0);
    EXPECT_EQ(m.state.batch, 2);
    std::unique_ptr<Engine> engine = two.engine(rank);
    last[rank] = m.round(*engine);
    ot::finish(*engine);
  });
  ASSERT_FALSE(commits[0].empty());  // rank 0's, which the survivors synced

  // The reference: 2 fresh ranks started from rank 0's commit.
  std::vector<Logs> reference(2);
  testing::run_ranks(2, [&](int rank) {
    Member& m = *fresh[rank];
    m.state.load_commit(commits[0]);
    std::unique_ptr<Engine> engine = restart.engine(rank);
    reference[rank] = m.round(*engine);
    ot::finish(*engine);
  });

  for (int r = 0; r < 2; ++r) {
    const Member& m = *members[r];
    const Member& f = *fresh[r];
    const std::string who = "rank " + std::to_string(r);
    EXPECT_EQ(model_bytes(*m.model), model_bytes(*members[0]->model)) << who;
    EXPECT_EQ(model_bytes(*m.model), model_bytes(*f.model)) << who;
    EXPECT_EQ(m.probe->train_begin, 1) << who;
    EXPECT_EQ(m.probe->reset, 1) << who;
    EXPECT_EQ(f.probe->train_begin, 0) << who;
    EXPECT_EQ(f.probe->reset, 1) << who;
    // scale_lr: the commit's rate x 2 / 3, in the re-formed world and the restart.
    EXPECT_DOUBLE_EQ(m.probe->lr_at_reset, kLr * 2 / 3) << who;
    EXPECT_DOUBLE_EQ(f.probe->lr_at_reset, kLr * 2 / 3) << who;
    // 2 batches in the world of 3, then 3 + 6 in the world of 2.
    EXPECT_EQ(m.probe->batches, 11) << who;
    EXPECT_EQ(f.probe->batches, 11) << who;
    ASSERT_EQ(m.probe->epochs.size(), 2u) << who;
    ASSERT_EQ(f.probe->epochs.size(), 2u) << who;
    for (size_t e = 0; e < 2; ++e) {
      // Every sample once per epoch: 24 taken by 3 ranks, 24 by 2.
      EXPECT_EQ(m.probe->epochs[e].at("samples"), kSamples) << who << " epoch " << e;
      EXPECT_EQ(m.probe->epochs[e].at("loss"), f.probe->epochs[e].at("loss")) << who;
      EXPECT_EQ(m.probe->epochs[e].at("accuracy"), f.probe->epochs[e].at("accuracy")) << who;
    }
    EXPECT_EQ(last[r], reference[r]) << who;
    EXPECT_EQ(m.state.epoch, 2) << who;
    EXPECT_EQ(m.state.batch, 0) << who;
  }
  // Rank 0's CSV: one row per epoch (its rows are committed), as the restart's.
  const std::string csv = read_file(dir.file("elastic0.csv"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3) << csv;
  EXPECT_EQ(csv, read_file(dir.file("restart0.csv")));
}

TEST(ElasticTrainer, ACommitHoldsPositionTotalsLossScaleAndCallbacksState) {
  torch::set_num_threads(1);
  torch::manual_seed(12);
  const Data data;
  zt::ZeroNet initial;
  testing::TempDir dir("kolo-elastic-trainer");
  Member m(initial, nullptr, dir.file("m.csv"));  // a world of one: no communicator needed
  m.data = &data;
  ThreadEngines one(1);
  std::unique_ptr<Engine> engine = one.engine(0);
  LossScalerOptions scaling;
  scaling.engine = engine.get();
  scaling.init_scale = 256;
  LossScaler scaler(scaling);
  auto early = std::make_shared<EarlyStopping>("loss", 5);
  m.round(*engine, 1, &scaler, early);
  // After the epoch: position (1, 0), fresh totals, the callbacks' state.
  const Bytes committed = m.state.committed();
  ASSERT_EQ(m.state.epoch, 1);
  const Callback::State early_state = early->save_state();
  const int64_t batches = m.probe->batches;
  EXPECT_EQ(batches, kSamples / kBatch);

  // Everything moves on; restore() brings it back (the callbacks' state on
  // the next fit, which applies it).
  m.state.epoch = 5;
  m.state.batch = 3;
  scaler.restore({{"kolo.loss_scale", "0x1p+3"}});
  m.state.restore();
  EXPECT_EQ(m.state.epoch, 1);
  EXPECT_EQ(m.state.batch, 0);
  EXPECT_EQ(m.state.totals().samples, 0);
  EXPECT_EQ(m.state.committed(), committed);

  // A fresh rank from the bytes: its callbacks get the committed state back
  // when its fit begins (on_reset, no on_train_begin), and it has nothing
  // left to train (epochs = 1 done).
  Member other(initial, nullptr, dir.file("other.csv"));
  other.data = &data;
  other.state.load_commit(committed);
  EXPECT_EQ(model_bytes(*other.model), model_bytes(*m.model));
  auto other_early = std::make_shared<EarlyStopping>("loss", 5);
  scaling.init_scale = 65536;  // the commit's 256 replaces it
  LossScaler other_scaler(scaling);
  other.round(*engine, 1, &other_scaler, other_early);
  EXPECT_EQ(other.probe->train_begin, 0);
  EXPECT_EQ(other.probe->reset, 1);
  EXPECT_EQ(other.probe->batches, batches);
  EXPECT_EQ(other_early->save_state(), early_state);
  EXPECT_EQ(other_scaler.scale_value(), 256);

  // LearningRateSchedule (rate x 0.5 at each epoch's start): a fit resumed
  // within an epoch keeps the epoch's committed rate instead of halving it
  // again. Epoch 0 fails one batch after its commit at batch 2 and resumes.
  Member halved(initial, nullptr, dir.file("halved.csv"));
  halved.data = &data;
  halved.probe->fail_at = 3;
  auto halve = std::make_shared<LearningRateSchedule>([](int64_t, double lr) { return lr / 2; });
  EXPECT_THROW(halved.round(*engine, 2, nullptr, halve), SimulatedFault);
  halved.state.restore();
  halved.round(*engine, 2, nullptr, halve);
  EXPECT_DOUBLE_EQ(current_lr(halved.sgd), kLr / 4);  // halved at epochs 0 and 1, once each

  // A TorchState's commit lacks the trainer's entries: a clear error.
  elastic::TorchState plain(*other.model, &other.sgd, kSamples);
  plain.commit();
  const std::string message =
      testing::error_of([&] { other.state.load_commit(plain.committed()); });
  EXPECT_NE(message.find("not written by a TrainerState"), std::string::npos) << message;
  ot::finish(*engine);
}

}  // namespace
}  // namespace kolo
