// MirroredStrategy (kolo/torch/mirrored.h): N replicas as threads of one
// process, alone or on every rank of a runtime, train as one process with N
// (or ranks x N) times the batch; bad input is a ContractError naming it; a
// replica that fails ends the others at once.
//
// Tolerance (float32, element-wise |a - e| <= atol + rtol * |e|): N = 1 in
// one process is bitwise (the same sums in the same order); otherwise the
// replicas' gradients are summed in another order than the single batch's:
// rtol 1e-5, atol 1e-6, as the DistributedOptimizer equivalence tests. The
// replicas themselves always hold bitwise equal parameters (they step with
// the same averaged gradient).
#include "kolo/torch/mirrored.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/core/store.h"
#include "kolo/torch/optimizer.h"
#include "optimizer_harness.h"
#include "test_net.h"
#include "thread_ranks.h"
#include "torch_harness.h"

namespace kolo {
namespace {

namespace ot = optimizer_testing;
using ot::Batch;
using ot::OptimizerKind;
using testing::error_of;
using testing::model_bytes;

constexpr int kSteps = 4;
constexpr int64_t kBatch = 3;  // rows per replica
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

// ot::Mlp, clonable: (rows, 8) -> (rows, 4) logits.
struct ReplicaMlpImpl : torch::nn::Cloneable<ReplicaMlpImpl> {
  ReplicaMlpImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(ReplicaMlp);

// `replicas` replicas of `threads` intra-op threads on the tests' engine settings.
MirroredOptions test_options(int replicas, int threads = 1) {
  MirroredOptions options;
  options.replicas = replicas;
  options.threads_per_replica = threads;
  options.engine = testing::torch_test_engine_options();
  return options;
}

torch::Tensor loss_of(ReplicaMlp& net, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(net->forward(x), y);
}

ReplicaMlp copy_of(const ReplicaMlp& net) {
  return ReplicaMlp(std::dynamic_pointer_cast<ReplicaMlpImpl>(net->clone()));
}

// The reference: one process, the plain optimizer, each step's whole batch.
ReplicaMlp train_single(const ReplicaMlp& initial, const std::vector<Batch>& batches,
                        OptimizerKind kind) {
  ReplicaMlp net = copy_of(initial);
  auto optimizer = ot::make_optimizer(kind, net->parameters(), 0.05);
  for (const Batch& batch : batches) {
    optimizer->zero_grad();
    loss_of(net, batch.x, batch.y).backward();
    optimizer->step();
  }
  return net;
}

// Rank `rank` of `ranks` (runtime null: this process alone) trains `replicas`
// replicas of `initial`: its process batch is block `rank` of each step's
// batch, which its replicas share.
std::vector<ReplicaMlp> train_mirrored(const ReplicaMlp& initial, const std::vector<Batch>& batches,
                                       OptimizerKind kind, int replicas, Runtime* runtime,
                                       int ranks = 1, int rank = 0) {
  MirroredOptions options = test_options(replicas);
  options.runtime = runtime;
  MirroredStrategy strategy(options);
  EXPECT_EQ(strategy.replicas(), replicas);
  EXPECT_EQ(strategy.num_replicas_in_sync(), ranks * replicas);
  std::vector<ReplicaMlp> nets = strategy.replicate(copy_of(initial));
  strategy.run([&](ReplicaContext& replica) {
    EXPECT_EQ(replica.rank(), rank * replicas + replica.replica());
    EXPECT_EQ(replica.size(), ranks * replicas);
    ReplicaMlp& net = nets[replica.replica()];
    auto optimizer = ot::make_optimizer(kind, net->parameters(), 0.05);
    DistributedOptimizer distributed(*optimizer, net->named_parameters(),
                                     replica.options<DistributedOptimizerOptions>());
    const int64_t rows = replicas * kBatch;  // the process batch
    for (const Batch& batch : batches) {
      const torch::Tensor x = batch.x.narrow(0, rank * rows, rows);
      const torch::Tensor y = batch.y.narrow(0, rank * rows, rows);
      distributed.zero_grad();
      loss_of(net, replica.slice(x), replica.slice(y)).backward();
      distributed.step();
    }
  });
  return nets;
}

void expect_replicas_equal(const std::vector<ReplicaMlp>& nets) {
  for (size_t r = 1; r < nets.size(); ++r) {
    EXPECT_EQ(model_bytes(*nets[r]), model_bytes(*nets[0])) << "replica " << r;
  }
}

class MirroredEquivalence : public ::testing::TestWithParam<std::tuple<int, OptimizerKind>> {};

TEST_P(MirroredEquivalence, ReplicasTrainAsOneProcessWithTheWholeBatch) {
  const auto [replicas, kind] = GetParam();
  torch::manual_seed(7);
  const ReplicaMlp initial;
  const std::vector<Batch> batches = ot::make_batches(kSteps, replicas * kBatch);
  ReplicaMlp expected = train_single(initial, batches, kind);
  std::vector<ReplicaMlp> nets = train_mirrored(initial, batches, kind, replicas, nullptr);
  ASSERT_EQ(nets.size(), static_cast<size_t>(replicas));
  expect_replicas_equal(nets);
  if (replicas == 1) {
    EXPECT_EQ(model_bytes(*nets[0]), model_bytes(*expected));
  } else {
    ot::expect_params_close(*nets[0], *expected, kRtol, kAtol, "replica 0");
  }
}

INSTANTIATE_TEST_SUITE_P(Replicas, MirroredEquivalence,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(OptimizerKind::kSgd,
                                                              OptimizerKind::kAdam)));

// Each replica computes with its own intra-op threads, and its engine serves
// everything a rank's does: here a process set of two of three replicas.
TEST(MirroredReplicas, HaveTheirThreadsAndProcessSets) {
  MirroredStrategy strategy(test_options(3, 2));
  EXPECT_EQ(strategy.threads_per_replica(), 2);
  std::vector<int> threads(3, 0);
  std::vector<float> sums(3, 0);
  strategy.run([&](ReplicaContext& replica) {
    threads[replica.replica()] = at::get_num_threads();
    const ProcessSet pair = add_process_set({0, 2}, replica.options());
    if (!pair.included()) return;
    TensorOpOptions o = replica.options<TensorOpOptions>();
    o.process_set = pair.id();
    o.op = ReduceOp::kSum;
    sums[replica.replica()] =
        allreduce(torch::full({2}, replica.rank() + 1.0f), "pair", o)[1].item<float>();
  });
  EXPECT_EQ(threads, std::vector<int>({2, 2, 2}));
  EXPECT_EQ(sums, std::vector<float>({4, 0, 4}));  // replicas 0 and 2: 1 + 3
}

// A runtime of `ranks` ranks as threads standing for processes (shm and gloo
// through a TCP store, as kolorun's workers): fn(rank, runtime).
void with_runtimes(const std::string& backend, int ranks,
                   const std::function<void(int, Runtime&)>& fn) {
  TcpStoreServer server({});
  testing::run_ranks(ranks, [&](int rank) {
    InitOptions options;
    options.env = map_env({{"KOLO_RANK", std::to_string(rank)},
                           {"KOLO_SIZE", std::to_string(ranks)},
                           {"KOLO_STORE_ADDR", "127.0.0.1"},
                           {"KOLO_STORE_PORT", std::to_string(server.port())},
                           {"KOLO_BACKEND", backend},
                           {"KOLO_TIMEOUT_SECONDS", "30"}});
    Runtime runtime(options);
    fn(rank, runtime);
  });
}

class MirroredOverRanks : public ::testing::TestWithParam<std::string> {};

// 2 ranks x 2 replicas = one process with 4 times the batch.
TEST_P(MirroredOverRanks, ReplicasOfEveryRankTrainAsOneProcess) {
  constexpr int kRanks = 2;
  constexpr int kReplicas = 2;
  torch::manual_seed(11);
  const ReplicaMlp initial;
  const std::vector<Batch> batches = ot::make_batches(kSteps, kRanks * kReplicas * kBatch);
  ReplicaMlp expected = train_single(initial, batches, OptimizerKind::kAdam);
  std::vector<std::vector<ReplicaMlp>> nets(kRanks);
  with_runtimes(GetParam(), kRanks, [&](int rank, Runtime& runtime) {
    nets[rank] =
        train_mirrored(initial, batches, OptimizerKind::kAdam, kReplicas, &runtime, kRanks, rank);
  });
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_EQ(nets[rank].size(), static_cast<size_t>(kReplicas));
    EXPECT_EQ(model_bytes(*nets[rank][0]), model_bytes(*nets[0][0])) << "rank " << rank;
    expect_replicas_equal(nets[rank]);
  }
  ot::expect_params_close(*nets[0][0], *expected, kRtol, kAtol, "rank 0 replica 0");
}

std::vector<std::string> backends() {
  std::vector<std::string> out{"shm"};
  if (KOLO_HAVE_GLOO) out.push_back("gloo");
  return out;
}
INSTANTIATE_TEST_SUITE_P(Backends, MirroredOverRanks, ::testing::ValuesIn(backends()));

TEST(MirroredErrors, RanksDisagreeingOnTheReplicaCountFailEverywhere) {
  std::vector<std::string> errors(2);
  with_runtimes("shm", 2, [&](int rank, Runtime& runtime) {
    errors[rank] = error_of([&] {
      MirroredOptions options;
      options.replicas = rank + 1;
      options.runtime = &runtime;
      MirroredStrategy strategy(options);
    });
  });
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("same number of replicas"), std::string::npos) << error;
    EXPECT_NE(error.find("from 1 to 2"), std::string::npos) << error;
  }
}

TEST(MirroredErrors, BadInputIsAClearContractError) {
  MirroredOptions options;
  options.replicas = 0;
  std::string error = error_of([&] { MirroredStrategy strategy(options); });
  EXPECT_NE(error.find("replicas must be at least 1, got 0"), std::string::npos) << error;

  options.replicas = 2;
  options.threads_per_replica = -1;
  error = error_of([&] { MirroredStrategy strategy(options); });
  EXPECT_NE(error.find("threads_per_replica must be >= 0"), std::string::npos) << error;

  options.threads_per_replica = 1;
  options.engine = testing::torch_test_engine_options();
  MirroredStrategy strategy(options);
  // Not Cloneable: ot::Mlp derives from torch::nn::Module directly.
  error = error_of([&] { strategy.replicate(std::make_shared<ot::Mlp>()); });
  EXPECT_NE(error.find("cannot be cloned for replica 1"), std::string::npos) << error;
  EXPECT_NE(error.find("torch::nn::Cloneable<"), std::string::npos) << error;

  error = error_of([&] { strategy.replica_batch(7); });
  EXPECT_NE(error.find("a batch of 7 rows cannot be shared equally by 2 replicas"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("e.g. 6 or 8"), std::string::npos) << error;
  EXPECT_EQ(strategy.replica_batch(8), 4);

  // slice() in a replica: every replica gets the error, run() rethrows it.
  error = error_of([&] {
    strategy.run([](ReplicaContext& replica) { replica.slice(torch::zeros({5, 2})); });
  });
  EXPECT_NE(error.find("a batch of 5 rows cannot be shared equally by 2 replicas"),
            std::string::npos)
      << error;
}

// One replica fails while the others wait for it in an allreduce: they fail
// with a RuntimeFault carrying its error (not at the communicator's 300 s
// timeout, which would be a TimeoutError), run() rethrows the first error,
// and the strategy refuses further runs.
TEST(MirroredErrors, AFailingReplicaEndsTheOthersAndTheStrategy) {
  MirroredStrategy strategy(test_options(3));
  std::vector<std::string> seen(3);
  std::string error = [&] {
    try {
      strategy.run([&](ReplicaContext& replica) {
        if (replica.replica() == 1) throw std::runtime_error("replica 1's data is corrupt");
        torch::Tensor x = torch::ones({4});
        try {
          allreduce(x, "x", replica.options<TensorOpOptions>());
        } catch (const RuntimeFault& e) {
          seen[replica.replica()] = e.what();
          throw;
        }
      });
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_EQ(error, "replica 1's data is corrupt");
  for (int r : {0, 2}) {
    EXPECT_NE(seen[r].find("replica 1's data is corrupt"), std::string::npos) << seen[r];
  }
  error = error_of([&] { strategy.run([](ReplicaContext&) {}); });
  EXPECT_NE(error.find("failed in an earlier run (replica 1: replica 1's data is corrupt)"),
            std::string::npos)
      << error;
}

// Through kolorun: tests/integration/mirrored_test.cc runs this binary as
// `kolorun -np 2 kolo_torch_tests --gtest_filter=MirroredUnderKolorun.*`;
// each process runs 2 replicas over the job's backend and checks them
// against the single-process reference it computes itself (the data and the
// initial model come from the same seed everywhere). Skipped when not
// launched by kolorun.
TEST(MirroredUnderKolorun, TwoProcessesOfTwoReplicasTrainAsOneProcess) {
  if (std::getenv("KOLO_RANK") == nullptr)
    GTEST_SKIP() << "run by tests/integration/mirrored_test.cc";
  constexpr int kReplicas = 2;
  init();
  const int ranks = kolo::size();
  const int rank = kolo::rank();
  torch::manual_seed(11);
  const ReplicaMlp initial;
  const std::vector<Batch> batches = ot::make_batches(kSteps, ranks * kReplicas * kBatch);
  ReplicaMlp expected = train_single(initial, batches, OptimizerKind::kAdam);
  std::vector<ReplicaMlp> nets =
      train_mirrored(initial, batches, OptimizerKind::kAdam, kReplicas, &runtime(), ranks, rank);
  expect_replicas_equal(nets);
  ot::expect_params_close(*nets[0], *expected, kRtol, kAtol, "replica 0");
  // Every process ends with the same weights.
  const std::string mine = model_bytes(*nets[0]);
  std::vector<uint8_t> all(mine.size() * ranks);
  runtime().world().allgather(mine.data(), all.data(), mine.size(), DType::kU8, {});
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(std::memcmp(all.data() + r * mine.size(), mine.data(), mine.size()), 0)
        << "rank " << r;
  }
  std::printf("mirrored under kolorun: rank %d of %d, %d replicas, %s backend\n", rank, ranks,
              kReplicas, runtime().world().backend());
  shutdown();
}

}  // namespace
}  // namespace kolo
