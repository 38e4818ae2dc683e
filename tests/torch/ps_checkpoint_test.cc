// Parameter-server checkpoints (PsOptions::checkpoint_dir, checkpoint_every,
// resume_from), ranks as threads:
//  - round trip: servers resumed from a save hold exactly the saved shards,
//    and every worker continues at the saved step;
//  - sync mode with Adam: 3 steps, a save, a new job resuming from it for 3
//    more steps ends exactly where 6 uninterrupted steps end (parameters and
//    optimizer state both restored);
//  - a save resumed at another server count, a damaged shard, and servers
//    resuming from different saves (one directory per server) are clear
//    errors;
//  - two phases: a save that fails on one server leaves the last complete
//    save, which the next job resumes from (a newer save only some servers
//    wrote is passed over, and its shards removed); each server keeps its
//    newest 3 saves;
//  - WorkerOptimizer's checkpoints (what kolo::ModelCheckpoint calls): saved
//    by the servers at each epoch's end, resumed at the epoch after it, equal
//    to the uninterrupted run; a period that does not fit the epochs, a
//    resume the servers did not make, and another period on resume are
//    errors naming what to set.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/torch/parameter_server.h"
#include "kolo/torch/ps_optimizer.h"
#include "optimizer_harness.h"
#include "temp_dir.h"
#include "thread_ranks.h"
#include "torch_harness.h"

namespace kolo::ps {
namespace {

namespace ot = kolo::optimizer_testing;
using ot::Batch;
using ot::Mlp;

constexpr std::chrono::milliseconds kTimeout{30000};
constexpr int64_t kBatch = 6;
constexpr int kWorkers = 2;

OptimizerFactory adam() {
  return [](std::vector<torch::Tensor> params) {
    return ot::make_optimizer(ot::OptimizerKind::kAdam, std::move(params), 0.01);
  };
}

PsOptions sync_options() {
  PsOptions o;
  o.mode = Mode::kSync;
  o.timeout = kTimeout;
  return o;
}

struct Job {
  std::vector<std::vector<torch::Tensor>> shards;  // per server, after the job
  std::vector<int64_t> start;                      // per worker: its clock when it began
};

// A server's part of a job: serves until every worker is done; returns a
// copy of its shard as it ends.
std::vector<torch::Tensor> serve(Mlp& model, Links links, const PsOptions& options) {
  Server server(model.named_parameters(), adam(), std::move(links), options);
  server.run();
  std::vector<torch::Tensor> shard;
  for (const torch::Tensor& t : server.shard()) shard.push_back(t.detach().clone());
  return shard;
}

// kWorkers workers and `servers` servers as threads, every rank starting from
// `initial` (the servers' copies count, or the checkpoint resumed): each
// worker trains from its first clock up to step `until` on its rows of
// batches[step].
Job run_job(int servers, const Mlp& initial, const std::vector<Batch>& batches, int64_t until,
            const PsOptions& options) {
  std::vector<std::shared_ptr<Mlp>> models;
  for (int r = 0; r < kWorkers + servers; ++r) models.push_back(ot::clone_of(initial));
  std::vector<Links> links = make_thread_links(kWorkers, servers, kTimeout);
  Job job;
  job.shards.resize(servers);
  job.start.resize(kWorkers);
  testing::run_ranks(kWorkers + servers, [&](int rank) {
    Mlp& model = *models[rank];
    if (rank >= kWorkers) {
      job.shards[rank - kWorkers] = serve(model, std::move(links[rank]), options);
      return;
    }
    Worker w(model.named_parameters(), std::move(links[rank]), options);
    job.start[rank] = w.clock();
    for (int64_t step = w.clock(); step < until; ++step) {
      const Batch& batch = batches[static_cast<size_t>(step)];
      w.pull();
      model.zero_grad();
      ot::loss_of(model, batch.rows(rank, kBatch, batch.x), batch.rows(rank, kBatch, batch.y))
          .backward();
      w.push();
    }
    // The final parameters: in sync mode this waits for the last round to
    // be applied with every worker's push, before any worker leaves.
    w.pull();
    w.finish();
  });
  return job;
}

// Server `server` of `servers`' shard of the save at `step` in `dir`.
std::string shard(const std::string& dir, int server, int servers, int64_t step) {
  return dir + "/ps-shard-" + std::to_string(server) + "-of-" + std::to_string(servers) + "-step-" +
         std::to_string(step) + ".kolo";
}

void expect_same_shards(const Job& a, const Job& b, const std::string& what) {
  ASSERT_EQ(a.shards.size(), b.shards.size()) << what;
  for (size_t s = 0; s < a.shards.size(); ++s) {
    ASSERT_EQ(a.shards[s].size(), b.shards[s].size()) << what;
    for (size_t i = 0; i < a.shards[s].size(); ++i) {
      EXPECT_TRUE(torch::equal(a.shards[s][i], b.shards[s][i]))
          << what << ": largest difference "
          << (a.shards[s][i] - b.shards[s][i]).abs().max().item<double>() << ": server " << s
          << " slice " << i;
    }
  }
}

class PsCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(5);
    initial = std::make_shared<Mlp>();
    batches = ot::make_batches(6, kWorkers * kBatch);
  }
  std::shared_ptr<Mlp> initial;
  std::vector<Batch> batches;
};

TEST_F(PsCheckpoint, SyncResumeContinuesIdentically) {
  testing::TempDir dir("kolo-ps-checkpoint");
  const Job reference = run_job(2, *initial, batches, 6, sync_options());

  PsOptions save = sync_options();
  save.checkpoint_dir = dir.path();
  save.checkpoint_every = 3;
  const Job first = run_job(2, *initial, batches, 3, save);
  EXPECT_TRUE(std::filesystem::exists(shard(dir.path(), 0, 2, 3)));
  EXPECT_TRUE(std::filesystem::exists(shard(dir.path(), 1, 2, 3)));

  // Round trip: resumed servers hold what was saved; workers start at step 3.
  PsOptions resume = sync_options();
  resume.resume_from = dir.path();
  const Job reloaded = run_job(2, *initial, batches, 3, resume);
  EXPECT_EQ(reloaded.start, (std::vector<int64_t>{3, 3}));
  expect_same_shards(first, reloaded, "resumed without a step");

  // 3 more steps from the save end where 6 uninterrupted ones do (Adam's
  // moments and step count came back too, or the updates would differ).
  const Job second = run_job(2, *initial, batches, 6, resume);
  EXPECT_EQ(second.start, (std::vector<int64_t>{3, 3}));
  expect_same_shards(reference, second, "3 + 3 steps against 6");
}

TEST_F(PsCheckpoint, AnotherServerCountIsRefused) {
  testing::TempDir dir("kolo-ps-checkpoint");
  PsOptions save = sync_options();
  save.checkpoint_dir = dir.path();
  save.checkpoint_every = 2;
  run_job(2, *initial, batches, 2, save);

  PsOptions resume = sync_options();
  resume.resume_from = dir.path();
  std::vector<Links> links = make_thread_links(kWorkers, 1, kTimeout);
  try {
    Server server(initial->named_parameters(), adam(), std::move(links[kWorkers]), resume);
    FAIL() << "a save of 2 servers resumed on 1";
  } catch (const ContractError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("it holds no shard of this server (ps-shard-0-of-1-step-<step>.kolo)"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("holds the shards of 2 server(s) and this job has 1"), std::string::npos)
        << text;
    EXPECT_NE(text.find("kolorun --servers 2"), std::string::npos) << text;
  }
}

TEST_F(PsCheckpoint, ADamagedShardIsAnErrorNamingIt) {
  testing::TempDir dir("kolo-ps-checkpoint");
  PsOptions save = sync_options();
  save.checkpoint_dir = dir.path();
  save.checkpoint_every = 1;
  run_job(1, *initial, batches, 1, save);
  const std::string damaged = shard(dir.path(), 0, 1, 1);
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  PsOptions resume = sync_options();
  resume.resume_from = dir.path();
  std::vector<Links> links = make_thread_links(kWorkers, 1, kTimeout);
  try {
    // The constructor finds the shard; run() loads it (once every table is
    // added) and refuses it before serving anyone.
    Server server(initial->named_parameters(), adam(), std::move(links[kWorkers]), resume);
    server.run();
    FAIL() << "a damaged shard was loaded";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find(damaged), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
}

TEST_F(PsCheckpoint, ServersResumingFromDifferentSavesAreRefused) {
  // One directory per server (as on hosts without a shared disk): server 0's
  // holds the save at step 2, server 1's the one at step 4.
  testing::TempDir early("kolo-ps-checkpoint"), late("kolo-ps-checkpoint");
  PsOptions save = sync_options();
  save.checkpoint_dir = early.path();
  save.checkpoint_every = 2;
  run_job(2, *initial, batches, 2, save);  // saves step 2
  save.checkpoint_dir = late.path();
  run_job(2, *initial, batches, 4, save);  // saves steps 2 and 4
  std::filesystem::remove(shard(early.path(), 1, 2, 2));
  for (int64_t step : {2, 4}) std::filesystem::remove(shard(late.path(), 0, 2, step));
  std::filesystem::remove(shard(late.path(), 1, 2, 2));

  PsOptions resume = sync_options();
  resume.idle_timeout = std::chrono::seconds(5);  // the servers give up on the refusing worker
  std::vector<Links> links = make_thread_links(1, 2, kTimeout);
  auto errors = testing::run_ranks_catching(3, [&](int rank) {
    auto model = ot::clone_of(*initial);
    PsOptions mine = resume;
    mine.resume_from = rank == 2 ? late.path() : early.path();
    if (rank >= 1) {
      Server server(model->named_parameters(), adam(), std::move(links[rank]), mine);
      server.run();
    } else {
      Worker w(model->named_parameters(), std::move(links[0]), mine);
    }
  });
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const ContractError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("parameter server 0 (world rank 1) continues from step 2 but parameter "
                        "server 1 (world rank 2) from step 4"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("a mix of two checkpoints"), std::string::npos) << text;
  }
}

TEST_F(PsCheckpoint, ASaveThatFailsOnOneServerLeavesTheLastCompleteOne) {
  testing::TempDir dir("kolo-ps-checkpoint");
  PsOptions save = sync_options();
  save.checkpoint_dir = dir.path();
  save.checkpoint_every = 2;
  // The workers and server 0 give up on the failed server within seconds.
  save.idle_timeout = std::chrono::seconds(5);
  save.timeout = std::chrono::seconds(5);
  const Job at2 = run_job(2, *initial, batches, 2, sync_options());
  // Server 1 cannot write its shard of step 4 (a directory stands where the
  // file goes: to that server, a full or broken disk); server 0 can.
  std::filesystem::create_directories(shard(dir.path(), 1, 2, 4));
  std::exception_ptr failed;
  try {
    run_job(2, *initial, batches, 6, save);
  } catch (...) {
    failed = std::current_exception();
  }
  ASSERT_TRUE(failed) << "the job went on after a failed save";
  std::string text;
  try {
    std::rethrow_exception(failed);
  } catch (const std::exception& e) {
    text = e.what();
  }
  EXPECT_NE(text.find("saving its checkpoint at step 4 failed"), std::string::npos) << text;
  EXPECT_TRUE(std::filesystem::exists(shard(dir.path(), 0, 2, 2)));
  EXPECT_TRUE(std::filesystem::exists(shard(dir.path(), 1, 2, 2)));
  std::filesystem::remove(shard(dir.path(), 1, 2, 4));

  // The next job resumes from step 2, the newest save both servers wrote,
  // exactly as it was, and server 0's shard of step 4 goes.
  PsOptions resume = sync_options();
  resume.resume_from = dir.path();
  const Job resumed = run_job(2, *initial, batches, 2, resume);
  EXPECT_EQ(resumed.start, (std::vector<int64_t>{2, 2}));
  expect_same_shards(at2, resumed, "resumed after a failed save");
  EXPECT_FALSE(std::filesystem::exists(shard(dir.path(), 0, 2, 4)));
}

TEST_F(PsCheckpoint, EachServerKeepsItsNewestSaves) {
  testing::TempDir dir("kolo-ps-checkpoint");
  PsOptions save = sync_options();
  save.checkpoint_dir = dir.path();
  save.checkpoint_every = 1;
  run_job(2, *initial, batches, 6, save);  // saves steps 1 to 6, keeps 4 to 6
  for (int server = 0; server < 2; ++server) {
    for (int64_t step = 1; step <= 6; ++step) {
      EXPECT_EQ(std::filesystem::exists(shard(dir.path(), server, 2, step)), step > 3)
          << "server " << server << ", step " << step;
    }
  }
}

// --- WorkerOptimizer's checkpoints -------------------------------------------

constexpr int64_t kStepsPerEpoch = 3;

// kWorkers workers (each a WorkerOptimizer on its own engine) and `servers`
// servers as threads train epochs of kStepsPerEpoch steps up to `epochs`, as
// kolo::Trainer with kolo::ModelCheckpoint does: load_checkpoint(dir) first
// when options.resume_from is set, save_checkpoint(dir) after every epoch
// when options.checkpoint_dir is. Returns the shards and, as `start`, the
// epoch each worker began at. With `errors`, each rank's exception is kept
// there (null: none) instead of the first one being rethrown.
Job run_epochs(int servers, const Mlp& initial, const std::vector<Batch>& batches, int64_t epochs,
               const PsOptions& options, const std::string& dir,
               std::vector<std::exception_ptr>* errors = nullptr) {
  std::vector<std::shared_ptr<Mlp>> models;
  for (int r = 0; r < kWorkers + servers; ++r) models.push_back(ot::clone_of(initial));
  std::vector<Links> links = make_thread_links(kWorkers, servers, kTimeout);
  testing::ThreadEngines engines(kWorkers);
  Job job;
  job.shards.resize(servers);
  job.start.resize(kWorkers);
  const auto rank_fn = [&](int rank) {
    Mlp& model = *models[rank];
    if (rank >= kWorkers) {
      job.shards[rank - kWorkers] = serve(model, std::move(links[rank]), options);
      return;
    }
    const std::unique_ptr<Engine> engine = engines.engine(rank);
    Worker w(model.named_parameters(), std::move(links[rank]), options);
    WorkerOptimizer optimizer(w, model, testing::on(*engine));
    int64_t epoch = 0;
    if (!options.resume_from.empty()) epoch = load_checkpoint(dir, optimizer).epoch;
    job.start[rank] = epoch;
    for (; epoch < epochs; ++epoch) {
      for (int64_t step = epoch * kStepsPerEpoch; step < (epoch + 1) * kStepsPerEpoch; ++step) {
        const Batch& batch = batches[static_cast<size_t>(step)];
        optimizer.zero_grad();
        ot::loss_of(model, batch.rows(rank, kBatch, batch.x), batch.rows(rank, kBatch, batch.y))
            .backward();
        optimizer.step();  // push, then pull the next step's parameters
      }
      CheckpointState state;
      state.epoch = epoch + 1;
      if (!options.checkpoint_dir.empty()) save_checkpoint(dir, optimizer, state);
    }
    w.finish();
  };
  if (errors) {
    *errors = testing::run_ranks_catching(kWorkers + servers, rank_fn);
  } else {
    testing::run_ranks(kWorkers + servers, rank_fn);
  }
  return job;
}

TEST_F(PsCheckpoint, WorkerOptimizerSavesThroughTheServersAndResumesAtTheirEpoch) {
  testing::TempDir dir("kolo-ps-checkpoint");
  const Job reference = run_job(2, *initial, batches, 2 * kStepsPerEpoch, sync_options());

  PsOptions save = sync_options();
  save.checkpoint_dir = dir.path();
  save.checkpoint_every = kStepsPerEpoch;
  run_epochs(2, *initial, batches, 1, save, dir.path());
  EXPECT_TRUE(std::filesystem::exists(shard(dir.path(), 0, 2, kStepsPerEpoch)));
  EXPECT_TRUE(std::filesystem::exists(shard(dir.path(), 1, 2, kStepsPerEpoch)));

  // Epoch 2 from the save of epoch 1 ends where 2 uninterrupted epochs end.
  PsOptions resume = save;
  resume.resume_from = dir.path();
  const Job second = run_epochs(2, *initial, batches, 2, resume, dir.path());
  EXPECT_EQ(second.start, (std::vector<int64_t>{1, 1}));
  expect_same_shards(reference, second, "1 + 1 epochs against 2");
}

TEST_F(PsCheckpoint, WorkerOptimizerCheckpointMisuseNamesWhatToSet) {
  testing::TempDir dir("kolo-ps-checkpoint");
  std::vector<Links> links = make_thread_links(1, 1, kTimeout);
  testing::ThreadEngines engines(1);
  PsOptions plain = sync_options();
  testing::run_ranks(2, [&](int rank) {
    auto model = ot::clone_of(*initial);
    if (rank == 1) {
      Server server(model->named_parameters(), adam(), std::move(links[1]), plain);
      server.run();
      return;
    }
    const std::unique_ptr<Engine> engine = engines.engine(0);
    Worker w(model->named_parameters(), std::move(links[0]), plain);
    WorkerOptimizer optimizer(w, *model, testing::on(*engine));
    // The servers were not told to save, nor to resume.
    std::string text = testing::error_of([&] { save_checkpoint(dir.path(), optimizer, {}); });
    EXPECT_NE(text.find("save_checkpoint('" + dir.path() +
                        "'): the parameter servers save the parameters and the optimizer's "
                        "state themselves"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("PsOptions::checkpoint_dir = '" + dir.path() +
                        "' and checkpoint_every = the steps of one epoch"),
              std::string::npos)
        << text;
    text = testing::error_of([&] { load_checkpoint(dir.path(), optimizer); });
    EXPECT_NE(text.find("PsOptions::resume_from = '" + dir.path() + "'"), std::string::npos)
        << text;
    w.finish();
  });

  // Saves every 2 steps while an epoch is 3: the epoch's end is not a save.
  PsOptions save = sync_options();
  save.checkpoint_dir = dir.path();
  save.checkpoint_every = 2;
  std::vector<std::exception_ptr> errors;
  run_epochs(1, *initial, batches, 1, save, dir.path(), &errors);
  std::string text = testing::error_of([&] { std::rethrow_exception(errors.at(0)); });
  EXPECT_NE(text.find("save_checkpoint('" + dir.path() +
                      "') after epoch 1 at step 3, and the "
                      "servers save every 2 steps (step 2 for this epoch)"),
            std::string::npos)
      << text;

  // A save every 3 steps resumed by a job that saves every 2 (the steps per
  // epoch changed): the server refuses it, naming both periods.
  testing::TempDir other("kolo-ps-checkpoint");
  save.checkpoint_dir = other.path();
  save.checkpoint_every = kStepsPerEpoch;
  run_epochs(1, *initial, batches, 1, save, other.path());
  PsOptions resume = save;
  resume.resume_from = other.path();
  resume.checkpoint_every = 2;
  run_epochs(1, *initial, batches, 2, resume, other.path(), &errors);
  text = testing::error_of([&] { std::rethrow_exception(errors.at(kWorkers)); });
  EXPECT_NE(text.find("ps-shard-0-of-1-step-3.kolo': it was saved every 3 steps and this job saves "
                      "every 2"),
            std::string::npos)
      << text;
  for (int w = 0; w < kWorkers; ++w) EXPECT_TRUE(errors.at(w)) << "worker " << w << " went on";
}

}  // namespace
}  // namespace kolo::ps
