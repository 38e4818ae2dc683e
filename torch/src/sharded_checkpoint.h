// kolo's sharded checkpoint (internal): the one schema in which every
// ParallelOptimizer saves (kolo/torch/parallel_optimizer.h). The files are
// zero_format.h's; sharded_checkpoint.cc writes and reads them for a
// ZeroOptimizer (every rank its slices, zero.h) and, through the functions
// below, for a DistributedOptimizer: rank 0 writes the index (stage 0, every
// rank's generator state) and one shard holding every parameter in full,
// which any stage loads at any world size, as it loads any ZeRO checkpoint.
#pragma once

#include <string>
#include <vector>

#include "common.h"
#include "gradient_pipeline.h"
#include "kolo/torch/checkpoint.h"
#include "kolo/torch/comm_hook.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace kolo::detail {

// What a replicated optimizer (every rank holds everything) saves.
struct ReplicatedCheckpoint {
  const std::vector<GradParam>& params;  // the optimized parameters, with their groups
  torch::optim::Optimizer& optimizer;
  torch::nn::Module& model;  // its buffers
  SetPosition position;
  CallOptions call;
  std::string name;  // prefix of the requests: "<name>.save...", "<name>.load..."
  // The optimizer's communication hook (nullptr = none): every rank's
  // save_state() is saved, and handed back to the same rank on a load into
  // as many ranks with the same hook.
  CommHook* hook = nullptr;
  // With a hook: the optimizer's count of completed exchanges (what hooks
  // see as CommBucket::step), saved and restored with the hook's state.
  int64_t* exchanges = nullptr;
};

// Collective. The optimizer's state must be element-wise (every state
// tensor shaped like its parameter, plus scalars such as Adam's step):
// anything else is a ContractError on every rank naming the parameter.
void save_replicated(const std::string& dir, const ReplicatedCheckpoint& what,
                     const CheckpointState& state);
// Collective: rank 0 reads the checkpoint (any stage, any world size), every
// rank gets it in full. Restores every rank's generator state when the
// checkpoint has one per rank of this world.
CheckpointState load_replicated(const std::string& dir, const ReplicatedCheckpoint& what);

// Every rank's default CPU generator state, gathered on every rank (one
// allgather, "<name>.rng").
std::vector<std::string> gather_generator_states(const std::string& name,
                                                 const CallOptions& options);
// Every rank's `bytes`, in rank order of the set, on every rank (one
// allgather, "<name>").
std::vector<std::string> gather_bytes(const std::string& bytes, const std::string& name,
                                      const CallOptions& options);

}  // namespace kolo::detail
