// kolo::elastic::TorchState on rank-threads: commit / restore / sync of a
// model with Adam's state, and the sampler re-sharded for a new world after a
// commit (a world that shrank, a world that grew) so that every sample of the
// epoch is taken exactly once across the worlds, counting only committed steps.
// kolorun and run() are not involved (tests/integration/elastic_test.cc and
// the example's elastic test cover them); each rank's State is pointed at its
// thread communicator instead of the default runtime.
#include "kolo/torch/elastic.h"

#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "kolo/core/checked_file.h"
#include "kolo/core/communicator.h"
#include "kolo/torch/mixed_precision.h"
#include "temp_dir.h"
#include "test_net.h"
#include "torch_harness.h"

namespace kolo {
namespace {

using elastic::TorchState;
using testing::error_of;
using testing::kTorchTimeout;
using testing::model_bytes;
using testing::Net;
using testing::run_ranks;
using testing::train_step;

// Gives every parameter a value that depends on `rank`, so that ranks differ.
void fill_for_rank(Net& net, int rank) {
  torch::NoGradGuard no_grad;
  int k = 0;
  for (auto& p : net.parameters()) p.copy_(torch::full_like(p, 0.1 * (rank + 1) + 0.01 * k++));
}

double adam_lr(torch::optim::Adam& adam) {
  return static_cast<torch::optim::AdamOptions&>(adam.param_groups()[0].options()).lr();
}

// One rank: a model, Adam and the state holding them.
struct Member {
  Member(int rank, size_t dataset_size, DistributedSamplerOptions sampling, Communicator* world)
      : adam(net.parameters(), torch::optim::AdamOptions(0.01 * (rank + 1))),
        state(net, &adam, dataset_size, sampling, options_for(world)) {
    fill_for_rank(net, rank);
  }
  static elastic::State::Options options_for(Communicator* world) {
    elastic::State::Options o;
    o.world = world;
    return o;
  }
  Net net;
  torch::optim::Adam adam;
  TorchState state;
};

class ElasticTorchState : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_F(ElasticTorchState, RestoreReturnsModelAdamAndPositionToTheCommit) {
  Member m(0, 100, {}, nullptr);  // world of one: no communicator needed
  EXPECT_EQ(m.state.world_size(), 1);
  m.state.restore();  // before any commit: nothing to return to, nothing changes
  train_step(m.net, m.adam, 1.0f);
  train_step(m.net, m.adam, 1.0f);
  m.state.epoch = 1;
  m.state.batch = 2;
  m.state.commit();
  const std::string at_commit = model_bytes(m.net);
  // The step after the commit, as taken from the commit: Adam's step count and
  // moments decide it, so an equal step after restore() shows they came back.
  train_step(m.net, m.adam, 1.0f);
  const std::string next_from_commit = model_bytes(m.net);

  train_step(m.net, m.adam, 3.0f);
  train_step(m.net, m.adam, 5.0f);
  static_cast<torch::optim::AdamOptions&>(m.adam.param_groups()[0].options()).lr(0.5);
  m.state.epoch = 4;
  m.state.batch = 9;
  ASSERT_NE(model_bytes(m.net), at_commit);

  m.state.restore();
  EXPECT_EQ(model_bytes(m.net), at_commit);
  EXPECT_EQ(m.state.epoch, 1);
  EXPECT_EQ(m.state.batch, 2);
  EXPECT_DOUBLE_EQ(adam_lr(m.adam), 0.01);
  train_step(m.net, m.adam, 1.0f);
  EXPECT_EQ(model_bytes(m.net), next_from_commit);

  // load_commit: the committed bytes resume a fresh member.
  Member fresh(2, 100, {}, nullptr);
  fresh.state.load_commit(m.state.committed());
  EXPECT_EQ(model_bytes(fresh.net), at_commit);
  EXPECT_EQ(fresh.state.epoch, 1);
  // Bytes that are not a TorchState commit, or of another dataset size.
  Member other(0, 50, {}, nullptr);
  other.state.epoch = 0;
  EXPECT_NE(error_of([&] { other.state.load_commit(Bytes{1, 2, 3}); }), "");
  Member big(0, 1000, {}, nullptr);
  for (int i = 0; i < 20; ++i) big.state.sampler().next(30);  // 600 of 1000 taken
  big.state.commit();
  const std::string message = error_of([&] { other.state.load_commit(big.state.committed()); });
  EXPECT_NE(message.find("600 samples"), std::string::npos) << message;
}

// Issue 21: a LossScaler's scale is part of every commit (TorchState::keep),
// so a restored world resumes with the scale it committed.
TEST_F(ElasticTorchState, KeptExtrasSuchAsTheLossScaleAreCommittedAndRestored) {
  Member m(0, 100, {}, nullptr);
  LossScalerOptions options;
  options.init_scale = 256;
  LossScaler scaler(options);
  m.state.keep([&] { return scaler.extras(); },
               [&](const TorchState::Extras& extras) { scaler.restore(extras); });
  m.state.commit();
  scaler.restore({{"kolo.loss_scale", "0x1p+3"}});  // as if steps overflowed since
  ASSERT_EQ(scaler.scale_value(), 8);
  m.state.restore();
  EXPECT_EQ(scaler.scale_value(), 256);
  // A fresh member resumes the scale from the committed bytes.
  Member fresh(1, 100, {}, nullptr);
  LossScaler resumed;
  fresh.state.keep([&] { return resumed.extras(); },
                   [&](const TorchState::Extras& extras) { resumed.restore(extras); });
  fresh.state.load_commit(m.state.committed());
  EXPECT_EQ(resumed.scale_value(), 256);
  // Keys of the state's own are refused at the commit.
  m.state.keep(
      [] {
        return TorchState::Extras{{"elastic/mine", "1"}};
      },
      [](const TorchState::Extras&) {});
  const std::string message = error_of([&] { m.state.commit(); });
  EXPECT_NE(message.find("'elastic/mine' starts with"), std::string::npos) << message;
}

// Issue 15: TorchState's commit file (what fashion_mnist --elastic writes to
// <dir>/elastic.commit and --resume reads): a flipped byte inside a weight
// used to load silently (NaN losses followed) and a truncated file failed
// with a libtorch backtrace that named no file. Both are now errors naming
// the file, with no backtrace, and the model keeps its weights.
TEST_F(ElasticTorchState, ADamagedCommitFileIsAnErrorNamingIt) {
  kolo::testing::TempDir dir("kolo-torch-commit");
  const std::string path = dir.file("elastic.commit");
  elastic::State::Options options;
  options.commit_path = path;
  Net net;
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(0.01));
  TorchState state(net, &adam, 100, {}, options);
  train_step(net, adam, 1.0f);
  state.epoch = 1;
  state.commit();
  std::string good;
  {
    std::ifstream in(path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  Member fresh(1, 100, {}, nullptr);
  fresh.state.load_commit_file(path);
  EXPECT_EQ(model_bytes(fresh.net), model_bytes(net));

  auto expect_rejected = [&](const std::string& bytes, const std::string& what) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    Member target(2, 100, {}, nullptr);
    const std::string weights = model_bytes(target.net);
    const std::string message = error_of([&] { target.state.load_commit_file(path); });
    EXPECT_NE(message.find("'" + path + "'"), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
    EXPECT_EQ(message.find("Exception raised from"), std::string::npos) << message;
    EXPECT_EQ(model_bytes(target.net), weights);
  };
  // A byte in the middle of the payload: the archive holds the weights there.
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x40;
  expect_rejected(flipped, "checksum mismatch");
  expect_rejected(good.substr(0, good.size() / 3), "truncated");
  // A well-formed container around a payload that is not a TorchState's.
  std::string payload = good.substr(32, 4 + 16) + "not an archive";
  expect_rejected(encode_checked(kElasticCommitFile, payload), "not a readable archive");
}

TEST_F(ElasticTorchState, SyncGivesEveryRankRankZerosModelAdamAndPosition) {
  constexpr int kRanks = 3;
  auto comms = make_thread_communicators(kRanks, kTorchTimeout);
  std::mutex mutex;
  std::map<int, std::string> after_sync, after_step;
  std::map<int, double> lrs;
  std::map<int, std::pair<int64_t, int64_t>> positions;
  run_ranks(kRanks, [&](int rank) {
    Member m(rank, 100, {}, comms[rank].get());
    // Ranks diverge: different weights, learning rates, Adam moments, positions.
    for (int s = 0; s <= rank; ++s) train_step(m.net, m.adam, 1.0f + rank);
    m.state.epoch = 10 + rank;
    m.state.batch = 20 + rank;
    m.state.sync(0);
    // The synced state is also what restore() returns to.
    train_step(m.net, m.adam, 7.0f);
    m.state.restore();
    const std::string synced = model_bytes(m.net);
    train_step(m.net, m.adam, 2.0f);
    std::lock_guard<std::mutex> lock(mutex);
    after_sync[rank] = synced;
    after_step[rank] = model_bytes(m.net);
    lrs[rank] = adam_lr(m.adam);
    positions[rank] = {m.state.epoch, m.state.batch};
  });
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_EQ(after_sync[r], after_sync[0]) << "rank " << r;
    EXPECT_EQ(after_step[r], after_step[0]) << "rank " << r << " (Adam's state differs)";
    EXPECT_DOUBLE_EQ(lrs[r], 0.01) << "rank " << r;
    EXPECT_EQ(positions[r], std::make_pair(int64_t{10}, int64_t{20})) << "rank " << r;
  }
}

// The indices each rank took in one world, per step; steps up to
// `committed_steps` count, later ones are lost with the world.
struct Taken {
  std::mutex mutex;
  std::map<size_t, int> count;  // sample -> times taken in committed steps
  void add(const std::vector<size_t>& indices) {
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i : indices) ++count[i];
  }
};

// Runs the epoch loop body of a training function on `states` (one per rank
// of `comms`): up to `max_steps` steps of `batch` samples, committing every
// `commit_every` steps; samples of committed steps (and, with
// count_uncommitted, of all steps) go to `taken`. Returns when the epoch's
// shard is exhausted or after max_steps.
void train_world(std::vector<Member*> members, std::vector<std::unique_ptr<Communicator>>& comms,
                 size_t batch, int commit_every, int max_steps, bool count_uncommitted,
                 Taken& taken) {
  const int n = static_cast<int>(members.size());
  run_ranks(n, [&](int rank) {
    TorchState& state = members[rank]->state;
    state.set_world(comms[rank].get());
    state.restore();
    state.sync(0);
    DistributedSampler& sampler = state.sampler();
    EXPECT_EQ(sampler.world_size(), n);
    EXPECT_EQ(sampler.rank(), rank);
    std::vector<size_t> pending;  // taken since the last commit
    for (int step = 0; step < max_steps; ++step) {
      auto indices = sampler.next(batch);
      if (!indices) break;
      pending.insert(pending.end(), indices->begin(), indices->end());
      ++state.batch;
      if (state.batch % commit_every == 0) {
        state.commit();
        taken.add(pending);
        pending.clear();
      }
    }
    if (count_uncommitted) taken.add(pending);
  });
}

void expect_each_sample_once(const Taken& taken, size_t n, size_t padding) {
  size_t extra = 0;
  for (size_t i = 0; i < n; ++i) {
    auto it = taken.count.find(i);
    ASSERT_NE(it, taken.count.end()) << "sample " << i << " was never taken";
    extra += static_cast<size_t>(it->second - 1);
  }
  EXPECT_EQ(taken.count.size(), n);
  EXPECT_EQ(extra, padding) << "samples taken more than once";
}

struct ReshardCase {
  size_t dataset;
  size_t padding;  // repeats the last world's shards need (drop_last = false)
};

class ElasticSamplerReshards : public ElasticTorchState,
                               public ::testing::WithParamInterface<ReshardCase> {};

// 3 ranks commit every 3 steps of 3 samples; the world dies one step after
// the commit (that step is lost), when the world has taken 27 samples, which
// 2 survivors cannot split evenly: they restore and finish the epoch from
// sample 27 of the order; then the next epoch runs whole on 2.
TEST_P(ElasticSamplerReshards, AfterAWorldShrinksEverySampleOnceBeyondTheCommit) {
  const size_t n = GetParam().dataset;
  DistributedSamplerOptions sampling;
  sampling.seed = 7;
  std::vector<std::unique_ptr<Member>> members;
  for (int r = 0; r < 3; ++r) members.push_back(std::make_unique<Member>(r, n, sampling, nullptr));

  Taken epoch0;
  auto world3 = make_thread_communicators(3, kTorchTimeout);
  train_world({members[0].get(), members[1].get(), members[2].get()}, world3, 3, 3, 4, false,
              epoch0);
  EXPECT_EQ(members[0]->state.batch, 4);
  EXPECT_EQ(members[0]->state.consumed_samples(), 4 * 9);
  members[2].reset();  // rank 2 dies; the others' last commit is after step 3

  auto world2 = make_thread_communicators(2, kTorchTimeout);
  train_world({members[0].get(), members[1].get()}, world2, 3, 3, 1000, true, epoch0);
  EXPECT_GE(members[0]->state.batch, 3 + 1);
  expect_each_sample_once(epoch0, n, GetParam().padding);

  // The next epoch is whole again: the epoch start belongs to one epoch.
  Taken epoch1;
  for (auto* m : {members[0].get(), members[1].get()}) {
    ++m->state.epoch;
    m->state.batch = 0;
    m->state.commit();
  }
  train_world({members[0].get(), members[1].get()}, world2, 3, 3, 1000, true, epoch1);
  expect_each_sample_once(epoch1, n, n % 2);
}

INSTANTIATE_TEST_SUITE_P(Datasets, ElasticSamplerReshards,
                         // 120 - 27 = 93 left: 47 per survivor, one sample repeated.
                         // 125 - 27 = 98: 49 per survivor.
                         ::testing::Values(ReshardCase{120, 1}, ReshardCase{125, 0}));

// 2 ranks commit, a newcomer joins at that commit (it receives the model,
// Adam and the position from rank 0) and 3 ranks finish the epoch.
TEST_F(ElasticTorchState, AfterAWorldGrowsTheNewcomerGetsTheStateAndItsShare) {
  constexpr size_t n = 96;
  std::vector<std::unique_ptr<Member>> members;
  for (int r = 0; r < 2; ++r)
    members.push_back(std::make_unique<Member>(r, n, DistributedSamplerOptions{}, nullptr));
  Taken taken;
  auto world2 = make_thread_communicators(2, kTorchTimeout);
  // 4 steps of 2 x 5 samples, committed every 2: growth happens at a commit,
  // after 40 samples, which 3 ranks cannot split evenly.
  train_world({members[0].get(), members[1].get()}, world2, 5, 2, 4, true, taken);
  EXPECT_EQ(members[0]->state.consumed_samples(), 40);

  members.push_back(std::make_unique<Member>(2, n, DistributedSamplerOptions{}, nullptr));
  ASSERT_NE(model_bytes(members[2]->net), model_bytes(members[0]->net));
  auto world3 = make_thread_communicators(3, kTorchTimeout);
  train_world({members[0].get(), members[1].get(), members[2].get()}, world3, 5, 2, 1000, true,
              taken);
  expect_each_sample_once(taken, n, 1);  // 56 left: 19 per rank, one repeated
  EXPECT_EQ(model_bytes(members[2]->net), model_bytes(members[0]->net));
  EXPECT_DOUBLE_EQ(adam_lr(members[2]->adam), 0.01);
  EXPECT_EQ(members[2]->state.batch, members[0]->state.batch);
  EXPECT_EQ(members[0]->state.batch, 4 + 4);  // 19 samples in batches of 5
}

TEST(ElasticSampler, EpochStartShardsTheRestAndIsSavedWithThePosition) {
  DistributedSamplerOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.seed = 3;
  DistributedSampler whole(10, o);
  DistributedSampler rest(10, o);
  rest.set_epoch_start(4);
  // The epoch's order is the same; rank 1 takes positions 4 + 1, 4 + 3, 4 + 5.
  o.rank = 0;
  o.world_size = 1;
  const std::vector<size_t> order = DistributedSampler(10, o).indices();
  EXPECT_EQ(rest.indices(), (std::vector<size_t>{order[5], order[7], order[9]}));
  EXPECT_EQ(whole.indices().size(), 5u);
  rest.next(2);
  EXPECT_EQ(rest.consumed(), 4 + 2 * 2);
  rest.next(2);
  EXPECT_EQ(rest.consumed(), 10);  // 4 + 3 * 2, no more than the dataset

  torch::serialize::OutputArchive out;
  rest.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  std::istringstream read(bytes.str());
  in.load_from(read);
  o.rank = 1;
  o.world_size = 2;
  DistributedSampler loaded(10, o);
  loaded.load(in);
  EXPECT_EQ(loaded.epoch_start(), 4);
  EXPECT_EQ(loaded.indices(), rest.indices());
  EXPECT_EQ(loaded.position(), rest.position());

  rest.set_epoch(1);  // a new epoch is whole
  EXPECT_EQ(rest.epoch_start(), 0);
  EXPECT_EQ(rest.indices().size(), 5u);
  const std::string message = error_of([&] { rest.set_epoch_start(11); });
  EXPECT_NE(message.find("start 11 is outside 0..10"), std::string::npos) << message;
}

}  // namespace
}  // namespace kolo
