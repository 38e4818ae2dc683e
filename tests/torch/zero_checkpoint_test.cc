// Sharded ZeRO checkpoints: a run saved at 4 workers resumes at 2 (sharded)
// and at 1 (after consolidation) with the same losses as the uninterrupted
// run, also across stages; a missing or corrupt shard is an error on every
// rank naming the file and the rank; a save that fails on one rank leaves
// the last complete save in place.
//
// Losses are compared with rtol 1e-5 (float32; the world sizes sum the
// gradients in different orders).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "kolo/core/checked_file.h"
#include "kolo/torch/zero.h"
#include "optimizer_harness.h"
#include "temp_dir.h"
#include "torch_harness.h"
#include "zero_harness.h"

namespace kolo {
namespace {

namespace zt = zero_testing;
using testing::run_with_engines;

constexpr int kSteps = 6;
constexpr int kSaveAfter = 3;  // steps before the checkpoint
constexpr int64_t kRows = 12;  // per step, divisible by 4, 2 and 1

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kolo-zero-test-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

// Trains steps [first, last) at `world` workers; rank 0's record of the loss
// of the whole step batch before each update (every rank computes it, so
// that stage 3's gathers stay collective). Loads `load_dir` first and saves
// into `save_dir` after the last step, when given. With `save_errors`, each
// rank's save error is kept there instead of failing the test, and rank
// `failing_rank` saves where no file can be written (a path through the
// index file: what a full or broken disk on one host looks like to it).
std::vector<double> train(const zt::ZeroNet& initial, const std::vector<zt::Batch>& batches,
                          int world, int stage, int first, int last, const std::string& load_dir,
                          const std::string& save_dir,
                          std::vector<std::string>* save_errors = nullptr, int failing_rank = -1) {
  if (save_errors != nullptr) save_errors->assign(world, "");
  std::vector<double> losses;
  std::vector<std::shared_ptr<zt::ZeroNet>> models;
  for (int r = 0; r < world; ++r) models.push_back(zt::copy_of(initial));
  run_with_engines(world, [&](int rank, Engine& engine) {
    zt::ZeroNet& model = *models[rank];
    auto adam = zt::make_optimizer(zt::Kind::kAdam, model.parameters());
    ZeroOptimizer zero(*adam, model, zt::zero_options(stage, engine));
    if (!load_dir.empty()) {
      const CheckpointState state = load_zero_checkpoint(load_dir, zero);
      EXPECT_EQ(state.step, first);
      EXPECT_EQ(state.extras.at("note"), "resume me");
    }
    for (int s = first; s < last; ++s) {
      double whole;
      {
        torch::NoGradGuard no_grad;
        whole = zt::loss_of(model, batches[s]).item<double>();
      }
      if (rank == 0) losses.push_back(whole);
      zero.zero_grad();
      zt::loss_of(model, batches[s].share(rank, world)).backward();
      zero.step();
    }
    if (!save_dir.empty()) {
      CheckpointState state;
      state.step = last;
      state.extras["note"] = "resume me";
      const std::string dir = rank == failing_rank ? save_dir + "/index.kolo/unwritable" : save_dir;
      if (save_errors == nullptr) {
        save_zero_checkpoint(dir, zero, state);
      } else {
        (*save_errors)[rank] = testing::error_of([&] { save_zero_checkpoint(dir, zero, state); });
      }
    }
    optimizer_testing::finish(engine);
  });
  return losses;
}

void expect_same_losses(const std::vector<double>& actual, const std::vector<double>& expected,
                        const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-5 * std::abs(expected[i])) << what << " step " << i;
  }
}

class ZeroCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    torch::manual_seed(5);
    batches_ = zt::make_batches(kSteps, kRows);
  }
  zt::ZeroNet initial_;
  std::vector<zt::Batch> batches_;
};

TEST_F(ZeroCheckpoint, SavedAtFourResumesAtTwoAndConsolidatedAtOne) {
  for (int stage : {2, 3}) {
    const std::string what = "saved at stage " + std::to_string(stage);
    const auto uninterrupted = train(initial_, batches_, 4, stage, 0, kSteps, "", "");
    const std::string dir = temp_dir("four-" + std::to_string(stage));
    const auto before = train(initial_, batches_, 4, stage, 0, kSaveAfter, "", dir);
    expect_same_losses(before, {uninterrupted.begin(), uninterrupted.begin() + kSaveAfter}, what);
    for (int r = 0; r < 4; ++r) {
      EXPECT_NE(testing::only_file_like(dir, "shard-" + std::to_string(r) + "-of-4-"), "");
    }
    const std::vector<double> rest(uninterrupted.begin() + kSaveAfter, uninterrupted.end());
    // Two workers, the same stage and another one.
    expect_same_losses(train(initial_, batches_, 2, stage, kSaveAfter, kSteps, dir, ""), rest,
                       what + ", resumed at 2 workers, stage " + std::to_string(stage));
    expect_same_losses(train(initial_, batches_, 2, 1, kSaveAfter, kSteps, dir, ""), rest,
                       what + ", resumed at 2 workers, stage 1");
    // Consolidated: one shard with everything, resumed by one worker.
    const std::string full = temp_dir("full-" + std::to_string(stage));
    consolidate_zero_checkpoint(dir, full);
    EXPECT_NE(testing::only_file_like(full, "shard-0-of-1-"), "");
    expect_same_losses(train(initial_, batches_, 1, stage, kSaveAfter, kSteps, full, ""), rest,
                       what + ", consolidated, resumed at 1 worker");
    // The consolidated parameters in a plain model equal the sharded ones.
    zt::ZeroNet plain_a, plain_b;
    load_zero_model(dir, plain_a);
    load_zero_model(full, plain_b);
    optimizer_testing::expect_params_close(plain_a, plain_b, 0, 0, what + " consolidated");
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(full);
  }
}

// Every rank's error, after loading `dir` at `world` workers.
std::vector<std::string> load_errors(const zt::ZeroNet& initial, const std::string& dir,
                                     int world) {
  std::vector<std::string> errors(world);
  run_with_engines(world, [&](int rank, Engine& engine) {
    auto model = zt::copy_of(initial);
    auto adam = zt::make_optimizer(zt::Kind::kAdam, model->parameters());
    ZeroOptimizer zero(*adam, *model, zt::zero_options(2, engine));
    errors[rank] = testing::error_of([&] { load_zero_checkpoint(dir, zero); });
    optimizer_testing::finish(engine);
  });
  return errors;
}

TEST_F(ZeroCheckpoint, MissingOrCorruptShardNamesTheFileAndTheRank) {
  const std::string dir = temp_dir("broken");
  train(initial_, batches_, 2, 2, 0, 1, "", dir);
  const std::string shard1 = testing::only_file_like(dir, "shard-1-of-2-");
  const std::string shard0 = testing::only_file_like(dir, "shard-0-of-2-");
  ASSERT_NE(shard1, "");
  ASSERT_NE(shard0, "");
  {
    // Flip one byte of the payload.
    std::fstream f(shard1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(100);
    f.write(&c, 1);
  }
  for (const std::string& error : load_errors(initial_, dir, 2)) {
    EXPECT_NE(error.find("shard of rank 1 of 2"), std::string::npos) << error;
    EXPECT_NE(error.find(shard1), std::string::npos) << error;
    EXPECT_NE(error.find("checksum"), std::string::npos) << error;
  }
  std::filesystem::remove(shard0);
  for (const std::string& error : load_errors(initial_, dir, 1)) {
    EXPECT_NE(error.find("shard of rank 0 of 2"), std::string::npos) << error;
    EXPECT_NE(error.find(shard0), std::string::npos) << error;
    EXPECT_NE(error.find("does not exist"), std::string::npos) << error;
  }
  std::filesystem::remove_all(dir);
}

// Issue 15: the index and shard 0 of one save with shard 1 of another (what a
// crash part-way through a save leaves) used to load and train. Every file of
// a save now carries the save's id; a mix is an error on every rank naming
// the shard and the index.
TEST_F(ZeroCheckpoint, AMixOfTwoSavesIsAnErrorNamingTheFiles) {
  const std::string first = temp_dir("save-a");
  const std::string second = temp_dir("save-b");
  train(initial_, batches_, 2, 2, 0, 1, "", first);
  train(initial_, batches_, 2, 2, 0, 2, "", second);
  // The first save's index names its own shard 1: that file now holds the
  // second save's bytes.
  const std::string first_shard1 = testing::only_file_like(first, "shard-1-of-2-");
  ASSERT_NE(first_shard1, "");
  std::filesystem::copy_file(testing::only_file_like(second, "shard-1-of-2-"), first_shard1,
                             std::filesystem::copy_options::overwrite_existing);
  for (const std::string& error : load_errors(initial_, first, 2)) {
    EXPECT_NE(error.find("'" + first_shard1 + "': belongs to save "), std::string::npos) << error;
    EXPECT_NE(error.find("the index '" + first + "/index.kolo' to save "), std::string::npos)
        << error;
    EXPECT_NE(error.find("mixes files of two saves"), std::string::npos) << error;
  }
  // Each save on its own still loads.
  for (const std::string& error : load_errors(initial_, second, 2)) EXPECT_EQ(error, "");
  std::filesystem::remove_all(first);
  std::filesystem::remove_all(second);
}

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A save that fails on one rank (its disk full) must not cost the last
// complete save: every rank gets the error, the directory holds exactly the
// files it held before, and training resumes from it as if the failed save
// had never been tried. Before, the ranks whose writes succeeded had renamed
// their new shards over the old ones, and no complete save remained.
TEST_F(ZeroCheckpoint, ASaveThatFailsOnOneRankKeepsTheLastCompleteSave) {
  for (int stage : {1, 3}) {
    const std::string what = "stage " + std::to_string(stage);
    const auto uninterrupted = train(initial_, batches_, 2, stage, 0, kSteps, "", "");
    const std::string dir = temp_dir("failed-save-" + std::to_string(stage));
    train(initial_, batches_, 2, stage, 0, kSaveAfter, "", dir);
    const std::vector<std::string> before = listing(dir);
    ASSERT_EQ(before.size(), 3u) << what;  // the index and 2 shards
    std::vector<std::string> errors;
    train(initial_, batches_, 2, stage, kSaveAfter, kSteps - 1, dir, dir, &errors, 1);
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(errors[r].find("kolo::save_zero_checkpoint"), std::string::npos)
          << what << ", rank " << r << ": " << errors[r];
      EXPECT_NE(errors[r].find("on rank 1: "), std::string::npos) << what << ": " << errors[r];
      EXPECT_NE(errors[r].find("unwritable"), std::string::npos) << what << ": " << errors[r];
    }
    EXPECT_EQ(listing(dir), before) << what;
    const std::vector<double> rest(uninterrupted.begin() + kSaveAfter, uninterrupted.end());
    expect_same_losses(train(initial_, batches_, 2, stage, kSaveAfter, kSteps, dir, ""), rest,
                       what + ", resumed from the last complete save");
    std::filesystem::remove_all(dir);
  }
}

// A complete save replaces the one before: its shards go once the new index
// is in place, so the directory holds one save's files.
TEST_F(ZeroCheckpoint, ACompleteSaveRemovesTheShardsOfTheOneBefore) {
  const std::string dir = temp_dir("two-saves");
  train(initial_, batches_, 2, 2, 0, 1, "", dir);
  const std::vector<std::string> first = listing(dir);
  train(initial_, batches_, 2, 2, 0, 2, "", dir);
  const std::vector<std::string> second = listing(dir);
  ASSERT_EQ(second.size(), 3u) << "the index and 2 shards";
  for (const std::string& name : first) {
    if (name != "index.kolo") {
      EXPECT_EQ(std::count(second.begin(), second.end(), name), 0) << name << " is left";
    }
  }
  for (const std::string& error : load_errors(initial_, dir, 2)) EXPECT_EQ(error, "");
  std::filesystem::remove_all(dir);
}

// Before format 3 the files' payloads were libtorch zip archives, read by
// libtorch's reader (unsafe on damaged input). Such an index is now refused
// on every rank naming the file and saying an older kolo wrote it.
TEST_F(ZeroCheckpoint, AnIndexWrittenByAnOlderKoloIsRefused) {
  const std::string dir = temp_dir("older");
  train(initial_, batches_, 2, 2, 0, 1, "", dir);
  torch::serialize::OutputArchive archive;
  archive.write("kind", c10::IValue(std::string("kolo-zero-index")));
  archive.write("format", c10::IValue(int64_t{2}));
  std::string zip;
  archive.save_to([&zip](const void* data, size_t n) {
    zip.append(static_cast<const char*>(data), n);
    return n;
  });
  write_checked_file(dir + "/index.kolo", kCheckpointFile, zip);
  for (const std::string& error : load_errors(initial_, dir, 2)) {
    EXPECT_NE(error.find(dir + "/index.kolo"), std::string::npos) << error;
    EXPECT_NE(error.find("written by an older kolo"), std::string::npos) << error;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kolo
