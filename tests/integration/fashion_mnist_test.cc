// The Fashion-MNIST example end to end through kolorun with 2 workers, on a
// small subset: it trains, prints rank 0's report, reaches a sane accuracy,
// and resumes from its checkpoint.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "kolorun_harness.h"

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

// Every "<label>: <number>" in the output, in order.
std::vector<double> values_after(const std::string& output, const std::string& label) {
  std::vector<double> values;
  const std::regex pattern(label + ": ([0-9.]+)");
  for (std::sregex_iterator it(output.begin(), output.end(), pattern), end; it != end; ++it) {
    values.push_back(std::stod((*it)[1].str()));
  }
  return values;
}

class FashionMnistExample : public ::testing::Test {
 protected:
  void SetUp() override { skip_unless_available(); }
};

// 2000 training images, 2 epochs (a few seconds of training per epoch on this
// machine's 2 shared cores): far from converged, but a model that learns
// nothing stays near 0.1 and this one passes 0.6.
TEST_F(FashionMnistExample, TrainsOnTwoWorkersThroughKolorunAndResumes) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("kolo-fashion-mnist-test-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  const std::vector<std::string> common = {"-np",
                                           "2",
                                           example_path(),
                                           "--train-subset=2000",
                                           "--test-subset=500",
                                           "--batch-size=32",
                                           "--threads=1",
                                           "--checkpoint-dir=" + dir,
                                           "--progress-lines=3"};

  std::vector<std::string> first = common;
  first.insert(first.end(), {"--epochs", "1"});
  RunResult r = run_kolorun(first, seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // Rank 0's report, once per epoch (the other rank prints nothing).
  EXPECT_NE(r.out.find("Fashion-MNIST: 2 worker(s) x 1 thread(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Epoch 1/1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("32/32 ["), std::string::npos) << r.out;  // ceil(1000 / 32) steps
  EXPECT_NE(r.out.find("ms/step - loss: "), std::string::npos) << r.out;
  EXPECT_EQ(values_after(r.out, "Epoch time").size(), 1u) << r.out;
  EXPECT_NE(r.out.find("| epoch | epoch time (s) | images/sec |"), std::string::npos) << r.out;
  const auto images_per_s = values_after(r.out, "Images/sec");
  ASSERT_EQ(images_per_s.size(), 1u) << r.out;
  EXPECT_GT(images_per_s[0], 0);
  const auto first_accuracy = values_after(r.out, "test accuracy");
  ASSERT_EQ(first_accuracy.size(), 1u) << r.out;
  EXPECT_GT(first_accuracy[0], 0.5) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoint.kolo"));

  // Resume for the second epoch from the checkpoint.
  std::vector<std::string> second = common;
  second.insert(second.end(), {"--epochs", "2", "--resume"});
  r = run_kolorun(second, seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Resumed from " + dir + "/checkpoint.kolo after epoch 1"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("Epoch 1/2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Epoch 2/2"), std::string::npos) << r.out;
  const auto second_accuracy = values_after(r.out, "test accuracy");
  ASSERT_EQ(second_accuracy.size(), 1u) << r.out;
  EXPECT_GT(second_accuracy[0], 0.6) << r.out;
  std::filesystem::remove_all(dir);
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

}  // namespace
}  // namespace kolo::kolorun_test
