// In-process replicas for torch models (mirrored.h).
#include "kolo/torch/mirrored.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <string>

#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"

namespace kolo {

namespace {

// The rows of `rows` that each of `replicas` takes; `what` names the call.
int64_t rows_per_replica(int64_t rows, int replicas, const std::string& what) {
  if (rows % replicas != 0) {
    const int64_t below = rows / replicas * replicas;
    throw ContractError(what + ": a batch of " + std::to_string(rows) +
                        " rows cannot be shared equally by " + std::to_string(replicas) +
                        " replicas; use a multiple of " + std::to_string(replicas) + " (e.g. " +
                        (below > 0 ? std::to_string(below) + " or " : std::string()) +
                        std::to_string(below + replicas) + ")");
  }
  return rows / replicas;
}

}  // namespace

torch::Tensor ReplicaContext::slice(const torch::Tensor& process_batch) const {
  if (!process_batch.defined() || process_batch.dim() == 0) {
    throw ContractError(
        "kolo::ReplicaContext::slice: the batch must be a tensor of at least one "
        "dimension (rows first)");
  }
  const int64_t b =
      rows_per_replica(process_batch.size(0), replicas_,
                       "kolo::ReplicaContext::slice (replica " + std::to_string(rank_) + ")");
  return process_batch.narrow(0, replica_ * b, b);
}

MirroredStrategy::MirroredStrategy(const MirroredOptions& options) {
  if (options.threads_per_replica < 0) {
    throw ContractError(
        "kolo::MirroredStrategy: threads_per_replica must be >= 0 (0 = share the "
        "process's threads), got " +
        std::to_string(options.threads_per_replica));
  }
  ReplicaGroupOptions group;
  group.replicas = options.replicas;
  group.runtime = options.runtime ? options.runtime : (is_initialized() ? &runtime() : nullptr);
  group.engine = options.engine;
  group_ = std::make_unique<ReplicaGroup>(group);
  threads_per_replica_ = options.threads_per_replica > 0
                             ? options.threads_per_replica
                             : std::max(1, at::get_num_threads() / group_->replicas());
}

MirroredStrategy::~MirroredStrategy() = default;

int MirroredStrategy::replicas() const { return group_->replicas(); }
int MirroredStrategy::num_replicas_in_sync() const { return group_->size(); }

int64_t MirroredStrategy::replica_batch(int64_t rows) const {
  return rows_per_replica(rows, group_->replicas(), "kolo::MirroredStrategy::replica_batch");
}

std::vector<std::shared_ptr<torch::nn::Module>> MirroredStrategy::replicate(
    const std::shared_ptr<torch::nn::Module>& model) const {
  if (!model) {
    throw ContractError("kolo::MirroredStrategy::replicate: the model is null");
  }
  std::vector<std::shared_ptr<torch::nn::Module>> out{model};
  for (int r = 1; r < group_->replicas(); ++r) {
    try {
      out.push_back(model->clone());
    } catch (const c10::Error& e) {
      throw ContractError("kolo::MirroredStrategy::replicate: model '" + model->name() +
                          "' cannot be cloned for replica " + std::to_string(r) + " (" +
                          e.what_without_backtrace() + "); derive it from torch::nn::Cloneable<" +
                          model->name() +
                          "> and register its submodules in reset(), or build one model per "
                          "replica yourself and broadcast replica 0's parameters");
    }
  }
  return out;
}

void MirroredStrategy::run(const std::function<void(ReplicaContext& replica)>& fn) {
  const int threads = threads_per_replica_;
  group_->run([&](int r) {
    // This thread's OpenMP team (torch's intra-op threads) before any op
    // initialises it from the process-wide count.
    at::init_num_threads();
    at::set_num_threads(threads);
    ReplicaContext context;
    context.replica_ = r;
    context.replicas_ = group_->replicas();
    context.rank_ = group_->member(r);
    context.size_ = group_->size();
    context.engine_ = &group_->engine(r);
    fn(context);
  });
}

}  // namespace kolo
