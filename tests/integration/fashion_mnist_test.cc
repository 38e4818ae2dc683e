// The Fashion-MNIST example end to end through kolorun with 2 workers, on a
// small subset: it trains, prints rank 0's report, reaches a sane accuracy,
// and resumes from its checkpoint; with --elastic on 3 workers it survives one
// of them being killed mid-epoch.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "kolorun_harness.h"
#include "temp_dir.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

std::string example_path() { return KOLO_BINARY_DIR "/examples/fashion_mnist/fashion_mnist"; }
constexpr const char* kDataDir = "/usr/share/datasets/fashion-mnist";

void skip_unless_available() {
  if (access(example_path().c_str(), X_OK) != 0) {
    GTEST_SKIP() << example_path() << " is not built (kolo_torch needs libtorch-dev)";
  }
  if (access((std::string(kDataDir) + "/train-images-idx3-ubyte.gz").c_str(), R_OK) != 0) {
    GTEST_SKIP() << kDataDir << " is missing (Debian package dataset-fashion-mnist)";
  }
}

// The small run most tests train: 2000 training images (1000 per worker at
// -np 2) in batches of 32, 500 test images, one thread per worker: a few
// seconds per epoch on this machine's 2 shared cores.
const std::vector<std::string> kSmallRun = {"--train-subset=2000", "--test-subset=500",
                                            "--batch-size=32", "--threads=1"};

class FashionMnistExample : public ::testing::Test {
 protected:
  void SetUp() override { skip_unless_available(); }
};

// Trains epoch 1 on 2 workers (2000 training images, batch 32, 500 test
// images: a few seconds per epoch on this machine's 2 shared cores) with a
// checkpoint in `dir`, then resumes from it for epoch 2, with `extra` flags
// in both runs. Far from converged, but a model that learns nothing stays
// near 0.1: this one passes 0.5 after epoch 1 and 0.6 after epoch 2. Both
// runs' output goes to `first` and `second` for the caller's own checks.
// `launch`: kolorun's flags before the program (parameter servers).
void train_then_resume(const std::string& dir, const std::vector<std::string>& extra,
                       RunResult& first, RunResult& second,
                       const std::vector<std::string>& launch = {}) {
  std::filesystem::remove_all(dir);
  std::vector<std::string> common = {"-np", "2"};
  common.insert(common.end(), launch.begin(), launch.end());
  common.insert(common.end(), {example_path(), "--checkpoint-dir=" + dir});
  common.insert(common.end(), kSmallRun.begin(), kSmallRun.end());
  common.insert(common.end(), extra.begin(), extra.end());

  std::vector<std::string> args = common;
  args.insert(args.end(), {"--epochs", "1"});
  first = run_kolorun(args, seconds(120));
  ASSERT_FALSE(first.timed_out) << first.out << first.err;
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const auto first_accuracy = numbers_after(first.out, "test accuracy: ");
  ASSERT_EQ(first_accuracy.size(), 1u) << first.out;
  EXPECT_GT(first_accuracy[0], 0.5) << first.out;

  args = common;
  args.insert(args.end(), {"--epochs", "2", "--resume"});
  second = run_kolorun(args, seconds(120));
  ASSERT_FALSE(second.timed_out) << second.out << second.err;
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_NE(second.out.find("Resumed from " + dir + " after epoch 1"), std::string::npos)
      << second.out;
  EXPECT_EQ(second.out.find("Epoch 1/2"), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("Epoch 2/2"), std::string::npos) << second.out;
  const auto second_accuracy = numbers_after(second.out, "test accuracy: ");
  ASSERT_EQ(second_accuracy.size(), 1u) << second.out;
  EXPECT_GT(second_accuracy[0], 0.6) << second.out;
}

TEST_F(FashionMnistExample, TrainsOnTwoWorkersThroughKolorunAndResumes) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("kolo-fashion-mnist-test-" + std::to_string(getpid()));
  RunResult first, second;
  ASSERT_NO_FATAL_FAILURE(train_then_resume(dir, {"--progress-lines=3"}, first, second));
  // Rank 0's report, once per epoch (the other rank prints nothing).
  const std::string& out = first.out;
  EXPECT_NE(out.find("Fashion-MNIST: 2 worker(s) x 1 thread(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("Epoch 1/1"), std::string::npos) << out;
  EXPECT_NE(out.find("32/32 ["), std::string::npos) << out;  // ceil(1000 / 32) steps
  EXPECT_NE(out.find("ms/step - loss: "), std::string::npos) << out;
  EXPECT_EQ(numbers_after(out, "Epoch time: ").size(), 1u) << out;
  EXPECT_NE(out.find("| epoch | epoch time (s) | images/sec |"), std::string::npos) << out;
  const auto images_per_s = numbers_after(out, "Images/sec: ");
  ASSERT_EQ(images_per_s.size(), 1u) << out;
  EXPECT_GT(images_per_s[0], 0);
  // kolo's sharded checkpoint: at --zero-stage 0 rank 0 writes one shard.
  EXPECT_TRUE(std::filesystem::exists(dir + "/index.kolo"));
  EXPECT_NE(testing::only_file_like(dir, "shard-0-of-1-"), "");
  std::filesystem::remove_all(dir);
}

// --compression powersgd: the gradients go as rank-2 factors (kolo::powersgd_hook,
// which needs no uncompressed step after the first) and the model still
// learns; the hook's error feedback and warm start are in the checkpoint, and
// the resumed run goes on from them.
TEST_F(FashionMnistExample, TrainsWithPowerSgdAndResumesItsState) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("kolo-fashion-mnist-powersgd-" + std::to_string(getpid()));
  RunResult first, second;
  ASSERT_NO_FATAL_FAILURE(train_then_resume(
      dir, {"--compression=powersgd", "--powersgd-rank=2", "--progress-lines=1"}, first, second));
  EXPECT_NE(first.out.find("gradient compression powersgd rank 2"), std::string::npos) << first.out;
  std::filesystem::remove_all(dir);

  // A rank the flag does not allow is refused by name.
  const RunResult r = run_kolorun(
      {"-np", "1", example_path(), "--compression=powersgd", "--powersgd-rank=0"}, seconds(60));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--powersgd-rank"), std::string::npos) << r.err;
}

// 3 workers, 1920 images in batches of 32 (20 steps per epoch), committing
// every 4 steps; worker 2 is SIGKILLed once rank 0 reports step 7. The two
// others go back to their commit at step 4 (at most one commit interval of
// work done again), share the epoch's remaining images and finish both epochs.
TEST_F(FashionMnistExample, ElasticRunSurvivesAKilledWorker) {
  KolorunProcess job({"-np", "3", "--min-np", "2", "--cooldown", "60", example_path(), "--elastic",
                      "--commit-every", "4", "--epochs", "2", "--train-subset=1920",
                      "--test-subset=300", "--batch-size=32", "--threads=1",
                      "--progress-lines=1000"});
  const std::regex step7(R"((^|\n) *7/20 \[)");
  ASSERT_TRUE(job.wait_for_stdout(
      [&](const std::string& out) { return std::regex_search(out, step7); }, seconds(90)));
  const pid_t victim = child_with_env(job.pid(), "KOLO_WORKER_ID=2");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  RunResult r = job.wait(seconds(90));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Round 1: 3 worker(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("round 2: 2 workers (ids 0,1)"), std::string::npos) << r.err;
  // The new world resumed from the commit at step 4 or 8 (if step 8 was
  // committed before the kill landed), within one interval of the kill.
  std::smatch resumed;
  const std::regex round2(R"(Round 2: 2 worker\(s\), \w+ backend; epoch 1 resumes at step (\d+))");
  ASSERT_TRUE(std::regex_search(r.out, resumed, round2)) << r.out;
  const int from = std::stoi(resumed[1]);
  EXPECT_TRUE(from == 4 || from == 8) << r.out;
  // Epoch 1 ends with the 2 survivors: 20 - from / ... steps in all, the last
  // line of an epoch reporting its whole length; then epoch 2 runs on 2.
  EXPECT_NE(r.out.find("Summary: 2 worker(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("30/30 ["), std::string::npos) << r.out;  // epoch 2: 1920 / 64 steps
  const auto accuracy = numbers_after(r.out, "test accuracy: ");
  ASSERT_EQ(accuracy.size(), 2u) << r.out;
  EXPECT_GT(accuracy.back(), 0.5) << r.out;
  // Each epoch's summary row covers the whole epoch, the part before the
  // re-formation too: its train images are the 1920 of the subset (plus at
  // most one padding image per worker and round). Before, epoch 1's row
  // covered only round 2's part of it (about 1920 - from * 96 images).
  const std::regex row(R"(\| (\d) \| (?:[0-9.]+ \| ){6}(\d+) \|)");
  int rows = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), row);
       it != std::sregex_iterator(); ++it) {
    ++rows;
    const int images = std::stoi((*it)[2]);
    EXPECT_GE(images, 1920) << "epoch " << (*it)[1] << "\n" << r.out;
    EXPECT_LE(images, 1920 + 3 + 2) << "epoch " << (*it)[1] << "\n" << r.out;
  }
  EXPECT_EQ(rows, 2) << r.out;
}

TEST_F(FashionMnistExample, ElasticWithZeroIsAClearError) {
  RunResult r =
      run_kolorun({"-np", "1", example_path(), "--elastic", "--zero-stage", "2"}, seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--elastic cannot be combined with --zero-stage 2"), std::string::npos)
      << r.err;
}

TEST_F(FashionMnistExample, MissingDataIsAClearErrorNamingTheFileAndPackage) {
  RunResult r =
      run_kolorun({"-np", "2", example_path(), "--data-dir", "/nonexistent/fmnist"}, seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("/nonexistent/fmnist/train-images-idx3-ubyte.gz"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("dataset-fashion-mnist"), std::string::npos) << r.err;
}

TEST_F(FashionMnistExample, TruncatedFileIsAClearErrorNamingIt) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("kolo-fashion-mnist-truncated-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* name :
       {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    fs::copy_file(fs::path(kDataDir) / name, dir / name);
  }
  // The first 100 KiB of the training images: a valid gzip stream that ends early.
  fs::copy_file(fs::path(kDataDir) / "train-images-idx3-ubyte.gz",
                dir / "train-images-idx3-ubyte.gz");
  fs::resize_file(dir / "train-images-idx3-ubyte.gz", 100 << 10);
  RunResult r = run_kolorun({"-np", "1", example_path(), "--data-dir", dir.string()}, seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find((dir / "train-images-idx3-ubyte.gz").string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// A data directory with Debian's label and test files and `train-images`
// made by `make` (given its path).
template <typename Make>
std::filesystem::path data_dir_with_train_images(const std::string& name, Make make) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("kolo-fashion-mnist-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* file :
       {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    fs::copy_file(fs::path(kDataDir) / file, dir / file);
  }
  make((dir / "train-images-idx3-ubyte.gz").string());
  return dir;
}

// Issue 15: a header announcing 2^31 images made the reader allocate 1.6 TB
// (an allocator backtrace); the counts are now checked against what the file
// holds, and the error names the file.
TEST_F(FashionMnistExample, AHeaderAnnouncingMoreImagesThanTheFileHoldsIsAClearError) {
  const auto dir = data_dir_with_train_images("huge-header", [](const std::string& path) {
    // An IDX header (gzip reads a file that is not compressed as it is):
    // magic 2051, 2^31 images of 28x28, then 10 images.
    std::string bytes = {0, 0, 8, 3, char(0x80), 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28};
    bytes += std::string(10 * 784, '\0');
    std::ofstream(path, std::ios::binary) << bytes;
  });
  const std::string file = (dir / "train-images-idx3-ubyte.gz").string();
  RunResult r = run_kolorun({"-np", "1", example_path(), "--data-dir", dir.string()}, seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(file + ": is truncated: the header announces 2147483648 images "
                              "(1683627180032 bytes), the file holds 7840"),
            std::string::npos)
      << r.err;
  std::filesystem::remove_all(dir);
}

// Issue 15: a FIFO as a data file made the reader wait forever for a writer.
TEST_F(FashionMnistExample, AFifoAsADataFileIsRefused) {
  const auto dir = data_dir_with_train_images(
      "fifo", [](const std::string& path) { ASSERT_EQ(mkfifo(path.c_str(), 0600), 0); });
  const std::string file = (dir / "train-images-idx3-ubyte.gz").string();
  RunResult r = run_kolorun({"-np", "1", example_path(), "--data-dir", dir.string()}, seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(file + ": is not a regular file"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

// Issue 15: a truncated elastic.commit failed with a libtorch backtrace that
// named no file; now the error names it (and a damaged one never loads).
TEST_F(FashionMnistExample, ADamagedElasticCommitIsAnErrorNamingIt) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("kolo-fashion-mnist-commit-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "elastic.commit") << "KOLOCMIT and then nothing";
  RunResult r = run_kolorun({"-np", "1", example_path(), "--elastic", "--resume",
                             "--train-subset=100", "--checkpoint-dir=" + dir.string()},
                            seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("kolo elastic commit '" + (dir / "elastic.commit").string() + "'"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("Exception raised from"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// --zero-stage 3 (kolo::ZeroOptimizer: parameters, gradients and Adam state
// sharded; every layer a ShardedUnit): 2 workers train one epoch and each
// writes its shard; one worker without --zero-stage (DistributedOptimizer)
// resumes from them for the second epoch: a checkpoint of any stage loads at
// any other stage and world size.
TEST_F(FashionMnistExample, ZeroStage3TrainsAndResumesAtAnotherWorkerCountAndStage) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("kolo-fashion-mnist-zero-test-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  const std::vector<std::string> flags = {
      example_path(), "--train-subset=1000",     "--test-subset=300", "--batch-size=32",
      "--threads=1",  "--checkpoint-dir=" + dir, "--progress-lines=1"};
  std::vector<std::string> first = {"-np", "2"};
  first.insert(first.end(), flags.begin(), flags.end());
  first.insert(first.end(), {"--zero-stage=3", "--epochs", "1"});
  RunResult r = run_kolorun(first, seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ZeRO stage 3"), std::string::npos) << r.out;
  const auto first_accuracy = numbers_after(r.out, "test accuracy: ");
  ASSERT_EQ(first_accuracy.size(), 1u) << r.out;
  EXPECT_GT(first_accuracy[0], 0.4) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/index.kolo"));
  for (const char* shard : {"shard-0-of-2-", "shard-1-of-2-"}) {
    EXPECT_NE(testing::only_file_like(dir, shard), "") << shard;
  }

  std::vector<std::string> second = {"-np", "1"};
  second.insert(second.end(), flags.begin(), flags.end());
  second.insert(second.end(), {"--epochs", "2", "--resume"});
  r = run_kolorun(second, seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Resumed from " + dir + " after epoch 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ZeRO stage 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Epoch 2/2"), std::string::npos) << r.out;
  const auto second_accuracy = numbers_after(r.out, "test accuracy: ");
  ASSERT_EQ(second_accuracy.size(), 1u) << r.out;
  EXPECT_GT(second_accuracy[0], 0.5) << r.out;
  std::filesystem::remove_all(dir);
}

// --balance (kolo::BatchBalancer): each global batch of 2 x 32 images is
// split by the workers' measured speed; the last partial global batch of the
// epoch is left out (1000 / 64 -> 15 steps). The split is whatever the two
// cores' speeds make it, but it always covers the global batch.
TEST_F(FashionMnistExample, BalancedBatchesTrainOnTwoWorkers) {
  RunResult r = run_kolorun(
      {"-np", "2", example_path(), "--balance", "--train-subset=1000", "--test-subset=300",
       "--batch-size=32", "--threads=1", "--epochs", "1", "--progress-lines=1"},
      seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("15/15 ["), std::string::npos) << r.out;
  std::smatch split;
  ASSERT_TRUE(
      std::regex_search(r.out, split, std::regex("Balanced batch per worker: ([0-9]+) ([0-9]+)")))
      << r.out;
  EXPECT_EQ(std::stoi(split[1].str()) + std::stoi(split[2].str()), 64) << r.out;
  const auto accuracy = numbers_after(r.out, "test accuracy: ");
  ASSERT_EQ(accuracy.size(), 1u) << r.out;
  EXPECT_GT(accuracy[0], 0.4) << r.out;
}

TEST_F(FashionMnistExample, BalanceWithElasticIsAClearError) {
  RunResult r = run_kolorun({"-np", "1", example_path(), "--balance", "--elastic"}, seconds(60));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--balance works without --elastic only"), std::string::npos) << r.err;
}

// --optimizer lars and lamb (the layer-wise optimizers, with the recipe's
// groups, warmup and cosine decay to a floor, and their trust-ratio options)
// train the example through kolorun; the banner names the optimizer, its
// schedule and its trust-ratio settings.
TEST_F(FashionMnistExample, LarsAndLambTrainOnTwoWorkers) {
  struct Case {
    std::string optimizer;
    std::vector<std::string> trust_flags;
    std::string banner;
  };
  for (const Case& c : {Case{"lars",
                             {"--trust-coefficient=0.002", "--trust-clip"},
                             "trust coefficient 0.002 (clip mode)"},
                        Case{"lamb",
                             {"--min-trust-ratio=0.05", "--max-trust-ratio=5"},
                             "trust ratio in [0.05, 5]"}}) {
    std::vector<std::string> args = {"-np",
                                     "2",
                                     example_path(),
                                     "--optimizer",
                                     c.optimizer,
                                     "--warmup-epochs=0.5",
                                     "--lr-decay=cosine",
                                     "--min-lr=0.001",
                                     "--train-subset=2000",
                                     "--test-subset=300",
                                     "--batch-size=64",
                                     "--threads=1",
                                     "--epochs",
                                     "2",
                                     "--progress-lines=1"};
    args.insert(args.end(), c.trust_flags.begin(), c.trust_flags.end());
    RunResult r = run_kolorun(args, seconds(120));
    const std::string& optimizer = c.optimizer;
    ASSERT_FALSE(r.timed_out) << r.out << r.err;
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("  " + optimizer + " lr "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("over 0.5 warmup epoch(s), then cosine to 0.001"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(c.banner), std::string::npos) << r.out;
    const auto accuracy = numbers_after(r.out, "test accuracy: ");
    ASSERT_EQ(accuracy.size(), 2u) << r.out;
    EXPECT_GT(accuracy[1], 0.5) << optimizer << "\n" << r.out;
  }
}

// The layer-wise optimizers' options given to the wrong optimizer, inverted
// trust-ratio bounds, or a floor without the cosine decay are refused by
// name before training starts.
TEST_F(FashionMnistExample, TrustRatioAndFloorFlagsOutOfPlaceAreClearErrors) {
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  for (const Case& c : {
           Case{{"--optimizer=lamb", "--trust-clip"}, "--trust-clip set kolo::LARS"},
           Case{{"--optimizer=adam", "--trust-coefficient=0.01"}, "--trust-clip set kolo::LARS"},
           Case{{"--optimizer=lars", "--min-trust-ratio=0.1"}, "--max-trust-ratio set kolo::LAMB"},
           Case{{"--optimizer=lamb", "--min-trust-ratio=2", "--max-trust-ratio=1"},
                "--min-trust-ratio 2 is above --max-trust-ratio 1"},
           Case{{"--min-lr=0.001"}, "--min-lr is the floor of --lr-decay cosine"},
       }) {
    std::vector<std::string> args = {"-np", "1", example_path()};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    RunResult r = run_kolorun(args, seconds(60));
    EXPECT_EQ(r.exit_code, 2) << c.message << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
}

// --precision bf16 (the forward pass under bf16 autocast) trains the example
// through kolorun at ZeRO stage 2; the banner names the precision.
TEST_F(FashionMnistExample, Bf16PrecisionTrainsOnTwoWorkers) {
  RunResult r = run_kolorun({"-np", "2", example_path(), "--precision", "bf16", "--zero-stage=2",
                             "--train-subset=1000", "--test-subset=300", "--batch-size=32",
                             "--threads=1", "--epochs", "1", "--progress-lines=1"},
                            seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ZeRO stage 2, precision bf16"), std::string::npos) << r.out;
  const auto accuracy = numbers_after(r.out, "test accuracy: ");
  ASSERT_EQ(accuracy.size(), 1u) << r.out;
  EXPECT_GT(accuracy[0], 0.4) << r.out;
}

// --strategy ps-sync on one server equals the allreduce run (the servers
// average every worker's gradient and apply Adam once per step, as
// DistributedOptimizer does): same test loss to the printed digit, both
// well past chance. 1000 images per worker, one epoch.
TEST_F(FashionMnistExample, SyncParameterServerTrainsAsAllreduceDoes) {
  std::vector<std::string> flags = kSmallRun;
  flags.insert(flags.end(), {"--epochs=1", "--progress-lines=0"});
  std::vector<std::string> allreduce = {"-np", "2", example_path()};
  allreduce.insert(allreduce.end(), flags.begin(), flags.end());
  RunResult a = run_kolorun(allreduce, seconds(120));
  ASSERT_FALSE(a.timed_out) << a.out << a.err;
  ASSERT_EQ(a.exit_code, 0) << a.out << a.err;

  std::vector<std::string> ps = {"-np",          "2",          "--servers", "1",
                                 example_path(), "--strategy", "ps-sync"};
  ps.insert(ps.end(), flags.begin(), flags.end());
  RunResult r = run_kolorun(ps, seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Parameter servers: 2 worker(s), 1 server(s), mode sync"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Fashion-MNIST: 2 worker(s) x 1 thread(s)"), std::string::npos) << r.out;
  EXPECT_EQ(numbers_after(r.out, "Epoch time: ").size(), 1u) << r.out;
  ASSERT_EQ(numbers_after(r.out, "Images/sec: ").size(), 1u) << r.out;
  EXPECT_GT(numbers_after(r.out, "Images/sec: ")[0], 0);
  // 32 steps of 2 pushes, applied as 32 sync rounds: one update per push.
  EXPECT_NE(r.out.find("Parameter server 0: 64 update(s), largest staleness 0, 0 worker(s) lost"),
            std::string::npos)
      << r.out;
  const auto ps_loss = numbers_after(r.out, "Test loss: ");
  const auto allreduce_loss = numbers_after(a.out, "Test loss: ");
  ASSERT_EQ(ps_loss.size(), 1u) << r.out;
  ASSERT_EQ(allreduce_loss.size(), 1u) << a.out;
  EXPECT_NEAR(ps_loss[0], allreduce_loss[0], 2e-3) << r.out << a.out;
  const auto accuracy = numbers_after(r.out, "test accuracy: ");
  ASSERT_EQ(accuracy.size(), 1u) << r.out;
  EXPECT_GT(accuracy[0], 0.5) << r.out;
}

// --checkpoint-dir with --strategy ps-sync: the servers' shards are the
// checkpoint, saved at each epoch's end (32 steps of 1000 images per worker
// in batches of 32); --resume restarts the servers from their shards and
// the workers at epoch 2. A resume with another worker count (another
// number of steps per epoch) is refused by the servers, naming both.
TEST_F(FashionMnistExample, ParameterServersCheckpointAndResume) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("kolo-fashion-mnist-ps-" + std::to_string(getpid()));
  RunResult first, second;
  ASSERT_NO_FATAL_FAILURE(train_then_resume(dir, {"--strategy", "ps-sync", "--progress-lines=0"},
                                            first, second, {"--servers", "2"}));
  // Each server's shards of both epochs' saves (steps 32 and 64).
  for (const char* step : {"32", "64"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/ps-shard-0-of-2-step-" + step + ".kolo")) << step;
    EXPECT_TRUE(std::filesystem::exists(dir + "/ps-shard-1-of-2-step-" + step + ".kolo")) << step;
  }
  EXPECT_NE(first.out.find("Saved " + dir), std::string::npos) << first.out;
  // The resumed job trains epoch 2 only: 32 rounds of 2 pushes per server.
  EXPECT_NE(second.out.find("Parameter server 1: 64 update(s)"), std::string::npos) << second.out;

  std::vector<std::string> args = {
      "-np",          "1",          "--servers", "2",
      example_path(), "--strategy", "ps-sync",   "--checkpoint-dir=" + dir,
      "--resume",     "--epochs=2"};
  args.insert(args.end(), kSmallRun.begin(), kSmallRun.end());
  const RunResult r = run_kolorun(args, seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.err.find("it was saved every 32 steps and this job saves every 63"),
            std::string::npos)
      << r.err;
  std::filesystem::remove_all(dir);
}

// Asynchronous and bounded-staleness training on two servers learn too;
// bounded staleness never exceeds its bound.
TEST_F(FashionMnistExample, AsyncAndSspParameterServersTrain) {
  for (const std::vector<std::string>& strategy :
       {std::vector<std::string>{"--strategy", "ps-async"},
        std::vector<std::string>{"--strategy", "ps-ssp", "--max-staleness", "1"}}) {
    std::vector<std::string> args = {"-np", "2", "--servers", "2", example_path()};
    args.insert(args.end(), kSmallRun.begin(), kSmallRun.end());
    args.insert(args.end(), {"--epochs=1", "--progress-lines=0"});
    args.insert(args.end(), strategy.begin(), strategy.end());
    RunResult r = run_kolorun(args, seconds(120));
    ASSERT_FALSE(r.timed_out) << r.out << r.err;
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto accuracy = numbers_after(r.out, "test accuracy: ");
    ASSERT_EQ(accuracy.size(), 1u) << r.out;
    EXPECT_GT(accuracy[0], 0.4) << r.out;
    EXPECT_NE(r.out.find("Parameter server 1: 64 update(s)"), std::string::npos) << r.out;
    if (strategy[1] == "ps-ssp") {
      const auto seen = numbers_after(r.out, "max staleness seen: ");
      ASSERT_EQ(seen.size(), 1u) << r.out;
      EXPECT_LE(seen[0], 1) << r.out;
    }
  }
}

// A --strategy ps-* job needs servers, and servers need a --strategy ps-*:
// either mismatch is an error naming the flag on every rank, before training.
TEST_F(FashionMnistExample, ParameterServerStrategyAndServersMustGoTogether) {
  RunResult r = run_kolorun({"-np", "2", example_path(), "--strategy", "ps-async"}, seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--strategy ps-async trains on parameter servers, and this job has none: "
                       "launch it with kolorun -np W --servers S"),
            std::string::npos)
      << r.err;

  r = run_kolorun({"-np", "2", "--servers", "1", example_path()}, seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("this job has parameter servers (kolorun --servers), which --strategy "
                       "allreduce does not use"),
            std::string::npos)
      << r.err;

  r = run_kolorun({"-np", "1", example_path(), "--strategy", "ps-sync", "--optimizer", "lamb"},
                  seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--strategy ps-sync cannot be combined with --optimizer lars/lamb"),
            std::string::npos)
      << r.err;
}

TEST_F(FashionMnistExample, UnknownOptimizerIsAClearError) {
  RunResult r = run_kolorun({"-np", "1", example_path(), "--optimizer", "adagrad"}, seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--optimizer"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("adagrad"), std::string::npos) << r.err;
}

TEST_F(FashionMnistExample, BadZeroStageIsAClearError) {
  RunResult r = run_kolorun({"-np", "1", example_path(), "--zero-stage", "4"}, seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--zero-stage: is '4'; use 0 (DistributedOptimizer"), std::string::npos)
      << r.err;
}

// --device cuda: on a machine without a GPU every worker says so and the job
// fails at once (on one, it trains); with a strategy that keeps its model on
// the CPU it is refused before training.
TEST_F(FashionMnistExample, CudaDeviceWithoutAGpuOrWithAnotherStrategyIsAClearError) {
  RunResult r = run_kolorun({"-np", "2", example_path(), "--device", "cuda", "--epochs", "1",
                             "--train-subset", "256", "--test-subset", "100"},
                            seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  if (r.err.find("--device cuda: no CUDA device is present") != std::string::npos) {
    EXPECT_NE(r.exit_code, 0);
  } else {
    EXPECT_EQ(r.exit_code, 0) << "a GPU is present: the example must train on it\n" << r.err;
  }
  RunResult mirrored = run_kolorun(
      {"-np", "1", example_path(), "--device", "cuda", "--strategy", "mirrored"}, seconds(60));
  ASSERT_FALSE(mirrored.timed_out) << mirrored.out << mirrored.err;
  EXPECT_EQ(mirrored.exit_code, 2) << mirrored.err;
  EXPECT_NE(mirrored.err.find("--device cuda trains with --strategy allreduce"), std::string::npos)
      << mirrored.err;
}

}  // namespace
}  // namespace kolo::kolorun_test
