// MirroredStrategy: N replicas of a model as threads of one process
// (TensorFlow's tf.distribute.MirroredStrategy; torch's old DataParallel,
// without its per-step scatter, replicate and gather).
//
//   kolo::MirroredStrategy strategy({.replicas = 4});
//   auto models = strategy.replicate(model);   // models[0] is `model`
//   strategy.run([&](kolo::ReplicaContext& replica) {
//     Net& net = models[replica.replica()];
//     torch::optim::SGD sgd(net->parameters(), 0.1);
//     kolo::DistributedOptimizer optimizer(sgd, *net,
//     replica.options<kolo::DistributedOptimizerOptions>()); for (each process batch (X, Y) of the
//     data set, loaded once) {
//       optimizer.zero_grad();
//       loss(net->forward(replica.slice(X)), replica.slice(Y)).backward();
//       optimizer.step();  // gradients averaged over every replica
//     }
//   });
//
// What each replica is. A member of a replica world (kolo/core/replica_group.h):
// replica r of rank p is member p * N + r of P * N, with an engine of its own
// (replica.options() points kolo's calls at it). So everything kolo offers a
// rank works for a replica: DistributedOptimizer (the one gradient pipeline:
// buckets, hooks, compression, communication hooks) averages gradients over
// all P * N replicas, broadcast_parameters, metric_average, and a
// DistributedSampler with {replica.rank(), replica.size()} shards the data
// set among them. In one process the gradients are averaged in process
// memory (the threads backend); under kolorun the replicas of every process
// form one world on the job's backend (Runtime::replica_communicators).
//
// The data set. It is loaded once per process, by the caller, and shared:
// replica.slice(batch) is the replica's rows of a process batch (a view, no
// copy), and samplers hand out indices into the one copy.
//
// Cores. Each replica computes with threads_per_replica torch intra-op
// threads (default: the process's intra-op threads divided among the
// replicas, at least one): run() sets them on each replica's thread
// (at::set_num_threads acts on the calling thread's OpenMP team).
//
// Equivalence. N replicas on batches of B, averaging (kAverage), take the
// step one replica takes on a batch of N * B when the loss is a mean over the
// batch: the gradients are the same sums, added in a different order (so
// equal to rounding, and bitwise at N = 1).
//
// Errors. replicas < 1, ranks disagreeing on it, a model that cannot be
// cloned, and a batch the replicas cannot share equally are ContractErrors
// naming the values. A replica that throws inside run() aborts its engine so
// the others fail at once (a RuntimeFault naming it), run() rethrows its
// error, and the strategy is unusable afterwards (build a new one).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "kolo/core/engine.h"
#include "kolo/core/export.h"
#include "kolo/core/replica_group.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

class Runtime;

struct MirroredOptions {
  int replicas = 1;  // N >= 1, in this process
  // Torch intra-op threads of each replica; 0 = the constructing thread's
  // at::get_num_threads() divided by replicas, at least 1.
  int threads_per_replica = 0;
  // The ranks underneath: null = kolo::runtime() when kolo::init() ran (its
  // ranks each run N replicas), else this process alone.
  Runtime* runtime = nullptr;
  // The replicas' engines; default: the runtime's (or environment's) settings.
  std::optional<EngineOptions> engine;
};

// One replica's view, handed to the function run() runs.
class ReplicaContext {
 public:
  int replica() const { return replica_; }  // r, in this process: 0..N-1
  int rank() const { return rank_; }        // p * N + r: shards data, names the replica in errors
  int size() const { return size_; }        // P * N replicas in the world
  Engine& engine() const { return *engine_; }
  // Options of kolo's calls (any struct deriving from CallOptions:
  // DistributedOptimizerOptions, TensorOpOptions, ...) that run on this
  // replica's engine.
  template <class Options = CallOptions>
  Options options() const {
    Options o;
    o.engine = engine_;
    return o;
  }
  // This replica's rows of a process batch: rows [r * b, (r + 1) * b) of
  // dimension 0, b = rows / N (a view). ContractError unless N divides rows.
  torch::Tensor slice(const torch::Tensor& process_batch) const;

 private:
  friend class MirroredStrategy;
  int replica_ = 0;
  int replicas_ = 1;
  int rank_ = 0;
  int size_ = 1;
  Engine* engine_ = nullptr;
};

class MirroredStrategy {
 public:
  // Builds the replicas' engines (collective across ranks, see
  // replica_group.h). ContractError for replicas < 1, threads_per_replica < 0,
  // or ranks that disagree on replicas.
  explicit MirroredStrategy(const MirroredOptions& options = {});
  ~MirroredStrategy();
  MirroredStrategy(const MirroredStrategy&) = delete;
  MirroredStrategy& operator=(const MirroredStrategy&) = delete;

  int replicas() const;              // N
  int num_replicas_in_sync() const;  // P * N
  int threads_per_replica() const { return threads_per_replica_; }
  // Rows per replica of a process batch of `rows`; ContractError unless
  // replicas() divides it (the message says which sizes would).
  int64_t replica_batch(int64_t rows) const;

  // replicas() models: [0] is `model`, the others deep copies of it
  // (Module::clone(): parameters, buffers, requires_grad, training mode).
  // ContractError when the model is not clonable (derive it from
  // torch::nn::Cloneable<Impl>, as TORCH_MODULE layers are).
  std::vector<std::shared_ptr<torch::nn::Module>> replicate(
      const std::shared_ptr<torch::nn::Module>& model) const;
  // The same for a module holder (TORCH_MODULE(Net)): replicas of type Net.
  template <class Holder, class Impl = typename Holder::ContainedType>
  std::vector<Holder> replicate(const Holder& model) const {
    std::vector<Holder> out;
    for (auto& module : replicate(std::static_pointer_cast<torch::nn::Module>(model.ptr()))) {
      out.emplace_back(std::dynamic_pointer_cast<Impl>(module));
    }
    return out;
  }

  // fn(replica) on one thread per replica, each computing with
  // threads_per_replica() intra-op threads; returns when all returned and
  // rethrows the first error (see "Errors" above).
  void run(const std::function<void(ReplicaContext& replica)>& fn);

  ReplicaGroup& group() { return *group_; }

 private:
  std::unique_ptr<ReplicaGroup> group_;
  int threads_per_replica_ = 1;
};

}  // namespace kolo
#pragma GCC visibility pop
