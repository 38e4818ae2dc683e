// Checkpoints: the file format (atomic write, every kind of damage
// rejected with the file named), the payload round trip, collective save and
// load on 1-3 rank-threads with the same error on every rank.
#include "kolo/torch/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/torch/metrics.h"
#include "kolo/torch/sampler.h"
#include "temp_dir.h"
#include "test_net.h"
#include "torch_harness.h"

namespace kolo {
namespace {

using testing::kTorchTimeout;
using testing::run_with_engines;

using kolo::testing::TempDir;
using testing::error_of;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(CheckpointFile, RoundTripLeavesNoTemporaryFile) {
  TempDir dir("kolo-ckpt-test");
  const std::string path = dir.file("model.ckpt");
  std::string payload(100000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7);
  write_checkpoint_file(path, payload);
  EXPECT_EQ(read_checkpoint_file(path), payload);
  EXPECT_EQ(read_file(path).size(), payload.size() + 32);
  // Overwriting replaces the file; no temporary is left next to it.
  write_checkpoint_file(path, "second");
  EXPECT_EQ(read_checkpoint_file(path), "second");
  EXPECT_EQ(std::system(("test $(ls -A '" + dir.path() + "' | wc -l) -eq 1").c_str()), 0);
}

TEST(CheckpointFile, EveryKindOfDamageIsRejectedWithTheFileNamed) {
  TempDir dir("kolo-ckpt-test");
  const std::string path = dir.file("c.ckpt");
  write_checkpoint_file(path, std::string(5000, 'x'));
  const std::string good = read_file(path);

  auto expect_rejected = [&](const std::string& bytes, const std::string& what) {
    write_file(path, bytes);
    const std::string message = error_of([&] { read_checkpoint_file(path); });
    EXPECT_NE(message.find("'" + path + "'"), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << "expected '" << what << "' in: " << message;
  };
  expect_rejected(good.substr(0, good.size() - 1), "truncated");
  expect_rejected(good.substr(0, 20), "truncated");
  expect_rejected("", "truncated");
  expect_rejected(good + "z", "trailing bytes");
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  expect_rejected(bad_magic, "bad magic");
  std::string bad_size = good;
  bad_size[16] ^= 1;
  expect_rejected(bad_size, "corrupt header");
  for (size_t at : {size_t{32}, size_t{2000}, good.size() - 1}) {
    std::string corrupt = good;
    corrupt[at] ^= 0x10;
    expect_rejected(corrupt, "checksum mismatch");
  }
  const std::string missing = dir.file("missing.ckpt");
  const std::string message = error_of([&] { read_checkpoint_file(missing); });
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
  const std::string unwritable =
      error_of([&] { write_checkpoint_file("/nonexistent-dir/x", "a"); });
  EXPECT_NE(unwritable.find("/nonexistent-dir/x"), std::string::npos) << unwritable;
}

using testing::all_tensors;
using testing::Net;
using testing::train_step;

void expect_same_tensors(const Net& a, const Net& b) {
  auto x = all_tensors(a);
  auto y = all_tensors(b);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(torch::equal(x[i], y[i])) << "tensor " << i;
}

TEST(CheckpointPayload, RoundTripOfModelOptimizerStateAndExtras) {
  Net a;
  torch::optim::Adam adam_a(a.parameters(), torch::optim::AdamOptions(0.01));
  train_step(a, adam_a, 1.0f);
  train_step(a, adam_a, 0.5f);
  CheckpointState state;
  state.epoch = 3;
  state.step = 41;
  state.seed = 0xFFFFFFFFFFFFFFF0ull;
  state.sampler = {3, 17};
  state.extras["note"] = std::string("binary\0data", 11);
  const std::string payload = encode_checkpoint(a, &adam_a, state, {"r0", "r1"});

  Net b;  // different initial values
  torch::optim::Adam adam_b(b.parameters(), torch::optim::AdamOptions(0.5));
  std::vector<std::string> rng;
  CheckpointState loaded = decode_checkpoint(payload, b, &adam_b, "mem", &rng);
  EXPECT_EQ(loaded.epoch, 3);
  EXPECT_EQ(loaded.step, 41);
  EXPECT_EQ(loaded.seed, 0xFFFFFFFFFFFFFFF0ull);
  EXPECT_EQ(loaded.sampler, (SamplerPosition{3, 17}));
  EXPECT_EQ(loaded.extras.at("note"), std::string("binary\0data", 11));
  EXPECT_EQ(rng, (std::vector<std::string>{"r0", "r1"}));
  expect_same_tensors(a, b);
  // The optimizer state and options came along: the next steps are identical.
  EXPECT_EQ(static_cast<torch::optim::AdamOptions&>(adam_b.param_groups()[0].options()).lr(), 0.01);
  train_step(a, adam_a, 0.25f);
  train_step(b, adam_b, 0.25f);
  expect_same_tensors(a, b);
}

TEST(CheckpointPayload, AModelThatDoesNotFitIsRejected) {
  Net a;
  const std::string payload = encode_checkpoint(a, nullptr, {});
  torch::nn::Module other;
  other.register_module("fc", torch::nn::Linear(5, 3));
  std::string message = error_of([&] { decode_checkpoint(payload, other, nullptr, "f.ckpt"); });
  EXPECT_NE(message.find("'f.ckpt'"), std::string::npos) << message;
  EXPECT_NE(message.find("param/fc.weight"), std::string::npos) << message;
  // Asking for optimizer state that was not saved.
  Net b;
  torch::optim::SGD sgd(b.parameters(), torch::optim::SGDOptions(0.1));
  message = error_of([&] { decode_checkpoint(payload, b, &sgd, "f.ckpt"); });
  EXPECT_NE(message.find("no optimizer state"), std::string::npos) << message;
}

// The payload in libtorch's own zip format, as kolo wrote it before format 3,
// with its first record declaring 1 TiB.
std::string forged_libtorch_payload() {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(int64_t{2}));
  archive.write("weights", torch::ones({4}));
  std::string zip;
  archive.save_to([&zip](const void* data, size_t n) {
    zip.append(static_cast<const char*>(data), n);
    return n;
  });
  // The first central-directory header (PK\1\2): 32-bit sizes at +20, +24.
  const size_t central = zip.find(std::string("PK\x01\x02", 4));
  EXPECT_NE(central, std::string::npos);
  for (size_t at : {central + 20, central + 24}) {
    for (int i = 0; i < 4; ++i) zip[at + static_cast<size_t>(i)] = char(0xff);
  }
  return zip;
}

// Before: the payload went to libtorch's zip reader, which allocated what a
// record declared (here 4 GiB, before finding it truncated) and crashed on
// crafted archives; a damaged payload (its checksum recomputed, which anyone
// can do) was unsafe to load. Now payloads are kolo-encoded archives: a
// libtorch zip is refused before libtorch sees it, saying an older kolo
// wrote it, and a payload cut anywhere is refused naming the file.
TEST(CheckpointPayload, OnlyKoloEncodedPayloadsAreReadAndEveryCutIsRefused) {
  Net a;
  Net b;
  std::string message =
      error_of([&] { decode_checkpoint(forged_libtorch_payload(), b, nullptr, "f.ckpt"); });
  EXPECT_NE(message.find("'f.ckpt'"), std::string::npos) << message;
  EXPECT_NE(message.find("written by an older kolo"), std::string::npos) << message;

  torch::optim::Adam adam(a.parameters(), torch::optim::AdamOptions(0.01));
  train_step(a, adam, 1.0f);
  const std::string payload = encode_checkpoint(a, &adam, {});
  torch::optim::Adam adam_b(b.parameters(), torch::optim::AdamOptions(0.01));
  const size_t step = std::max<size_t>(1, payload.size() / 97);
  for (size_t keep = 0; keep < payload.size(); keep += step) {
    message = error_of([&] { decode_checkpoint(payload.substr(0, keep), b, &adam_b, "f.ckpt"); });
    EXPECT_NE(message.find("kolo checkpoint 'f.ckpt': the payload is not a readable archive"),
              std::string::npos)
        << keep << ": " << message;
  }
  // The untouched payload still loads.
  decode_checkpoint(payload, b, &adam_b, "f.ckpt");
  expect_same_tensors(a, b);
}

// Each bound of the decoder, on a payload forged where a generator state (a
// uint8 tensor of 8 bytes) is encoded: u8 dtype, u8 requires_grad, u8 rank,
// i64 size, the bytes (torch/src/archive_codec.h).
TEST(CheckpointPayload, ForgedTensorHeadersAreRefusedNamingTheFile) {
  Net a;
  const std::string payload = encode_checkpoint(a, nullptr, {}, {"rngstate"});
  const size_t data = payload.find("rngstate");
  ASSERT_NE(data, std::string::npos);
  const size_t size_at = data - 8, rank_at = size_at - 1, dtype_at = size_at - 3;
  ASSERT_EQ(payload[rank_at], 1);
  auto refused = [&](size_t at, const std::string& bytes, const std::string& expected) {
    std::string forged = payload;
    forged.replace(at, bytes.size(), bytes);
    Net b;
    const std::string message = error_of([&] { decode_checkpoint(forged, b, nullptr, "f.ckpt"); });
    EXPECT_NE(message.find("kolo checkpoint 'f.ckpt': the payload is not a readable archive"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  };
  std::string tib(8, '\0');
  tib[5] = 1;  // 2^40 bytes, little-endian
  refused(size_at, tib, "more elements than the");
  refused(rank_at, std::string(1, char(200)), "rank 200");
  refused(dtype_at, std::string(1, char(99)), "unknown dtype 99");
  refused(size_at, std::string(8, char(0xff)), "size -1");
}

// A forged payload whose manifest fits the model but whose saved weight has
// its two sizes swapped (same bytes) used to load and reshape the model's
// parameter to [4, 3]; now it is refused before the model is touched.
TEST(CheckpointPayload, SavedTensorsThatDoNotFitTheModelAreRefused) {
  Net a;
  const std::string payload = encode_checkpoint(a, nullptr, {});
  // The entry "weight" of module "fc": key, kind 1, dtype, grad, rank 2, sizes.
  const size_t key = payload.find(std::string("\x06\0\0\0weight\x01", 11));
  ASSERT_NE(key, std::string::npos);
  const size_t sizes = key + 11 + 3;
  ASSERT_EQ(payload[sizes - 1], 2);
  std::string forged = payload;
  forged.replace(sizes, 8, payload.substr(sizes + 8, 8));
  forged.replace(sizes + 8, 8, payload.substr(sizes, 8));
  Net b;
  const torch::Tensor before = b.fc->weight.clone();
  const std::string message = error_of([&] { decode_checkpoint(forged, b, nullptr, "f.ckpt"); });
  EXPECT_NE(message.find("the saved tensor 'fc.weight' is Float [4, 3], the model's Float [3, 4]"),
            std::string::npos)
      << message;
  EXPECT_TRUE(torch::equal(b.fc->weight, before));
}

TEST(CheckpointRng, GeneratorStateRoundTrip) {
  torch::manual_seed(5);
  const std::string state = default_generator_state();
  const torch::Tensor first = torch::rand({4});
  set_default_generator_state(state);
  EXPECT_TRUE(torch::equal(torch::rand({4}), first));
  EXPECT_THROW(set_default_generator_state("short"), ContractError);
}

class CheckpointCollective : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointCollective, SaveOnRootLoadEverywhere) {
  const int n = GetParam();
  TempDir dir("kolo-ckpt-test");
  const std::string path = dir.file("run.ckpt");
  std::vector<Net> saved(n);
  run_with_engines(n, [&](int rank, Engine& engine) {
    CheckpointOptions o;
    o.engine = &engine;
    o.timeout = kTorchTimeout;
    o.rng = false;  // ranks as threads share one generator (see checkpoint.h)
    Net& net = saved[rank];
    torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    train_step(net, sgd, 1.0f + rank);
    CheckpointState state;
    state.epoch = 2;
    state.step = 7;
    state.sampler = {2, 5};
    save_checkpoint(path, net, &sgd, state, o);

    Net fresh;
    torch::optim::SGD fresh_sgd(fresh.parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
    CheckpointState loaded = load_checkpoint(path, fresh, &fresh_sgd, o);
    EXPECT_EQ(loaded.epoch, 2);
    EXPECT_EQ(loaded.step, 7);
    EXPECT_EQ(loaded.sampler, (SamplerPosition{2, 5}));
    EXPECT_FALSE(loaded.rng_restored);
    expect_same_tensors(saved[0], fresh);  // root's model everywhere
  });
}

TEST_P(CheckpointCollective, DamagedOrMissingFileIsTheSameErrorOnEveryRank) {
  const int n = GetParam();
  TempDir dir("kolo-ckpt-test");
  const std::string path = dir.file("bad.ckpt");
  {
    Net net;
    write_checkpoint_file(path, encode_checkpoint(net, nullptr, {}));
    std::string bytes = read_file(path);
    write_file(path, bytes.substr(0, bytes.size() / 2));
  }
  std::vector<std::string> messages(n);
  std::vector<std::string> missing(n);
  run_with_engines(n, [&](int rank, Engine& engine) {
    CheckpointOptions o;
    o.engine = &engine;
    o.timeout = kTorchTimeout;
    Net net;
    messages[rank] = error_of([&] { load_checkpoint(path, net, nullptr, o); });
    missing[rank] = error_of([&] { load_checkpoint(dir.file("none.ckpt"), net, nullptr, o); });
  });
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_NE(messages[rank].find(path), std::string::npos) << messages[rank];
    EXPECT_NE(messages[rank].find("truncated"), std::string::npos) << messages[rank];
    EXPECT_NE(missing[rank].find("does not exist"), std::string::npos) << missing[rank];
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CheckpointCollective, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

// Data-parallel training by hand (gradients averaged with allreduce_), for the
// resume test: everything is deterministic, so losses can be compared bitwise.
class TinyTraining {
 public:
  TinyTraining(int rank, int size, Engine& engine, int init)
      : engine_(engine),
        sgd_(net_.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)),
        sampler_(kSamples, [&] {
          DistributedSamplerOptions o;
          o.rank = rank;
          o.world_size = size;
          o.seed = 17;
          return o;
        }()) {
    torch::NoGradGuard no_grad;
    int k = 0;
    for (auto& t : all_tensors(net_)) {
      t.copy_((torch::arange(t.numel(), torch::kDouble).reshape(t.sizes()) * 0.01 + init + k++)
                  .to(t.scalar_type()));
    }
    x_ = torch::linspace(-1, 1, kSamples * 4).reshape({kSamples, 4});
    y_ = torch::sin(x_.matmul(torch::tensor({0.5f, -1.0f, 2.0f, 0.25f})).unsqueeze(1) *
                    torch::tensor({1.0f, 2.0f, 3.0f}));
  }

  // Trains until `epochs` are done or `max_steps` steps were taken.
  void train(int64_t epochs, int64_t max_steps = -1) {
    for (; epoch_ < epochs; ++epoch_, fresh_epoch_ = true) {
      if (fresh_epoch_) sampler_.set_epoch(epoch_);
      fresh_epoch_ = false;
      while (auto batch = sampler_.next(4)) {
        step(*batch);
        if (max_steps >= 0 && ++steps_ == max_steps) return;
      }
    }
  }

  CheckpointState state() const {
    CheckpointState s;
    s.epoch = epoch_;
    s.step = steps_;
    s.sampler = sampler_.position();
    return s;
  }
  void resume(const CheckpointState& s) {
    epoch_ = s.epoch;
    steps_ = s.step;
    sampler_.set_position(s.sampler);
    fresh_epoch_ = false;
  }

  Net& net() { return net_; }
  torch::optim::SGD& optimizer() { return sgd_; }
  const std::vector<double>& losses() const { return losses_; }

 private:
  static constexpr int64_t kSamples = 48;

  void step(const std::vector<size_t>& batch) {
    const torch::Tensor index =
        torch::tensor(std::vector<int64_t>(batch.begin(), batch.end()), torch::kLong);
    sgd_.zero_grad();
    torch::Tensor loss =
        (net_.forward(x_.index_select(0, index)) - y_.index_select(0, index)).pow(2).mean();
    loss.backward();
    int i = 0;
    for (auto& p : net_.parameters()) allreduce_(p.grad(), "grad" + std::to_string(i++), opts());
    sgd_.step();
    losses_.push_back(metric_average(loss.item<double>(), "loss", opts()));
  }
  TensorOpOptions opts() {
    TensorOpOptions o;
    o.engine = &engine_;
    o.timeout = kTorchTimeout;
    return o;
  }

  Engine& engine_;
  Net net_;
  torch::optim::SGD sgd_;
  DistributedSampler sampler_;
  torch::Tensor x_;
  torch::Tensor y_;
  int64_t epoch_ = 0;
  int64_t steps_ = 0;
  bool fresh_epoch_ = true;
  std::vector<double> losses_;
};

TEST_P(CheckpointCollective, ResumeMidEpochReproducesTheUninterruptedLosses) {
  const int n = GetParam();
  TempDir dir("kolo-ckpt-test");
  const std::string path = dir.file("resume.ckpt");
  run_with_engines(n, [&](int rank, Engine& engine) {
    CheckpointOptions o;
    o.engine = &engine;
    o.timeout = kTorchTimeout;
    o.rng = false;  // nothing random in this training; threads share the generator
    TinyTraining straight(rank, n, engine, 0);
    straight.train(3);

    // Interrupted run: stop in the middle of epoch 1, save, resume from a
    // fresh (differently initialised) model, optimizer and sampler.
    TinyTraining first(rank, n, engine, 0);
    const int64_t steps_per_epoch = static_cast<int64_t>((48 / n + 3) / 4);
    first.train(3, steps_per_epoch + 2);
    save_checkpoint(path, first.net(), &first.optimizer(), first.state(), o);
    TinyTraining second(rank, n, engine, 5);
    second.resume(load_checkpoint(path, second.net(), &second.optimizer(), o));
    second.train(3);

    std::vector<double> resumed = first.losses();
    resumed.insert(resumed.end(), second.losses().begin(), second.losses().end());
    ASSERT_EQ(resumed.size(), straight.losses().size());
    for (size_t i = 0; i < resumed.size(); ++i) {
      EXPECT_EQ(resumed[i], straight.losses()[i]) << "step " << i << " rank " << rank;
    }
    // Parameters agree everywhere; BatchNorm's running statistics are local to
    // each rank and the checkpoint holds root's, so only root matches fully.
    for (size_t i = 0; i < second.net().parameters().size(); ++i) {
      EXPECT_TRUE(torch::equal(second.net().parameters()[i], straight.net().parameters()[i]));
    }
    if (rank == 0) {
      EXPECT_TRUE(testing::model_bytes(second.net()) == testing::model_bytes(straight.net()));
    }
  });
}

TEST(CheckpointCollective, RestoresTheGeneratorAtWorldSizeOne) {
  TempDir dir("kolo-ckpt-test");
  const std::string path = dir.file("rng.ckpt");
  run_with_engines(1, [&](int, Engine& engine) {
    CheckpointOptions o;
    o.engine = &engine;
    o.timeout = kTorchTimeout;
    Net net;
    torch::manual_seed(123);
    save_checkpoint(path, net, nullptr, {}, o);
    const torch::Tensor expected = torch::rand({3});
    torch::manual_seed(999);
    CheckpointState state = load_checkpoint(path, net, nullptr, o);
    EXPECT_TRUE(state.rng_restored);
    EXPECT_TRUE(torch::equal(torch::rand({3}), expected));
  });
}

}  // namespace
}  // namespace kolo
