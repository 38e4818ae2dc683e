// ZeroOptimizer's shared state (internal): the partition into buckets and
// slices, the pieces handed to the wrapped optimizer, and the stage-3 units.
// Used by zero_partition.cc, zero_optimizer.cc, zero_unit.cc,
// sharded_checkpoint.cc and zero_memory.cc.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "gradient_pipeline.h"
#include "kolo/torch/tensor.h"
#include "kolo/torch/zero.h"

namespace torch::optim {
class Optimizer;
}

namespace kolo::detail {

// One parameter of the wrapped optimizer: the pipeline's parameter (name,
// tensor, group, bucket, offset within it, elements).
using ZeroParam = GradParam;

// Parameter p's place in a (numel) flat buffer of its bucket, shaped like p.
inline torch::Tensor slot_of(const torch::Tensor& flat, const ZeroParam& p) {
  return flat.narrow(0, p.offset, p.numel).view(p.param.sizes());
}

inline bool occupies(const torch::Tensor& t, const torch::Tensor& slot) {
  return GradientPipeline::occupies(t, slot);
}

// A run of consecutive elements of one bucket's slice on this rank whose
// parameters all belong to one group: one parameter of the wrapped optimizer.
struct ZeroPiece {
  int bucket = 0;
  int group = 0;
  int64_t begin = 0;  // within this rank's slice of the bucket
  int64_t numel = 0;
  torch::Tensor value;  // view of bucket.shard
};

// The part of one parameter inside a piece.
struct PieceRun {
  int param = 0;       // index into ZeroState::params
  int64_t offset = 0;  // first element within the (flattened) parameter
  int64_t begin = 0;   // first element within the piece
  int64_t numel = 0;
};

// One bucket: consecutive parameters of one dtype, laid end to end in a flat
// buffer and split across the ranks (even_split, kolo/core/split.h, as the
// engine's reducescatter splits it); bucket b of the pipeline has
// the same parameters. Which buffers exist:
//
//            full (the parameters)   shard             grad_shard        flat_grad
//   stage 1  always held             view of full      view of flat_grad (numel) the .grad()s
//   stage 2  always held             view of full      own (shard_numel) -
//   stage 3  only while gathered     own (shard_numel) own (shard_numel) -
//
// At stages 1 and 2 the model's parameters are views of `full` (as DeepSpeed's
// and FSDP's flat parameters), so this rank's slice is the parameters' own
// memory: the wrapped optimizer updates them in place and the allgather after
// the step writes the other ranks' slices around it (in place). At stage 1 the
// model's gradients are views of `flat_grad` too: backward accumulates into it
// (AccumulateGrad adds in place to a defined .grad()), and the reduce-scatter
// runs in place, leaving this rank's reduced slice in its first shard_numel
// elements (`grad_shard`).
struct ZeroBucket {
  std::string name;         // suffix of the request names
  std::vector<int> params;  // indices into ZeroState::params, in flat order
  int64_t numel = 0;
  int64_t shard_begin = 0;
  int64_t shard_numel = 0;
  c10::ScalarType dtype = torch::kFloat;
  torch::Device device = torch::kCPU;  // the parameters' (the gradient pipeline's bucket)
  // The options of a flat buffer of the bucket (its dtype, on its device).
  torch::TensorOptions options() const {
    return torch::TensorOptions().dtype(dtype).device(device);
  }
  torch::Tensor full;        // (numel) the parameters' storage (see above)
  int64_t full_nbytes = 0;   // bytes of `full` when it holds the parameters
  torch::Tensor shard;       // (shard_numel) this rank's parameter slice (authoritative)
  torch::Tensor grad_shard;  // (shard_numel) reduced gradient of the slice
  torch::Tensor flat_grad;   // stage 1: (numel) the parameters' gradients, reduced in place
  torch::Tensor full_grad;   // stages 2, 3: (numel) packed gradients being reduce-scattered

  // Stage 3: the unit's parameters are views of `full`, whose storage is
  // released (0 bytes) while the unit is not in use.
  int unit = -1;
  Handle gather;  // allgather of the slices into full
  bool gathering = false;
  bool gathered = false;  // full holds the parameters (after gather completed)
};

// The ZeroOptimizer's state and its policy over the gradient pipeline:
// buckets are the flat shard buffers; launching one reduce-scatters it into
// this rank's slice (stage 1 in place on the flat gradients at step(); stages
// 2 and 3 packed, inside backward, one bucket in flight at a time).
struct ZeroState : GradientPipeline::Policy {
  explicit ZeroState(const ZeroOptions& o);
  static GradientPipeline::Options pipeline_options(const ZeroOptions& o);

  ZeroOptions options;
  Engine* engine = nullptr;
  CallOptions call;
  RequestOptions request;  // set, op = average, prescale 1/k
  int rank = 0;
  int size = 1;
  torch::optim::Optimizer* optimizer = nullptr;
  torch::nn::Module* model = nullptr;

  GradientPipeline pipeline;
  std::mutex& mutex = pipeline.mutex;  // hooks (autograd thread) vs the training thread
  std::vector<ZeroParam>& params = pipeline.params;
  std::vector<ZeroBucket> buckets;  // buckets[b] is the pipeline's bucket b
  std::vector<ZeroPiece> pieces;
  std::vector<ShardedUnitImpl*> units;  // stage 3, bucket i belongs to units[i]

  // Stage 3 order of use (bucket indices) in the previous and current step,
  // for prefetching.
  std::vector<int> last_order;
  std::vector<int> order;
  bool pinned = false;  // gather_parameters(): keep everything gathered

  // Memory peaks.
  ZeroMemory peak;

  // --- zero_partition.cc ---
  // Fills params, buckets, pieces from the optimizer (stage 1/2: by bytes,
  // stage 3: one bucket per unit) and rewrites the optimizer's groups.
  void build(const std::vector<std::pair<std::string, ShardedUnitImpl*>>& named_units);
  // The parameters a piece holds, in element order.
  std::vector<PieceRun> runs_of(const ZeroPiece& piece) const;
  // A layer-wise optimizer (LARS, LAMB; kolo/torch/layerwise.h) gets the
  // layers of its pieces (layer = index into params, the same on every rank)
  // and one allreduce of its per-layer partial norms per step. No-op for
  // other optimizers.
  void describe_layers();

  // --- zero_optimizer.cc ---
  void launch(int bucket, bool in_backward) override;  // GradientPipeline::Policy
  void finished(int bucket, bool ok) override;
  void submit_reduce(int bucket);
  // Every bucket reduced (those backward did not complete launched now).
  void finish_reductions();
  void adopt_params();           // stages 1, 2: every parameter a view of its bucket's `full`
  void allgather_into_params();  // stages 1, 2
  void point_piece_grads();
  void zero_flat_grads();  // stage 1: zeroes flat_grad, the model's .grad() views of it

  // --- zero_unit.cc (stage 3) ---
  void start_gather(int bucket);
  void finish_gather(int bucket);
  void release(int bucket);
  torch::Tensor unit_forward(int bucket, const std::weak_ptr<ZeroState>& self,
                             torch::nn::AnyModule& inner, const torch::Tensor& x);
  void before_backward(int bucket);
  void release_all();

  // --- zero_memory.cc ---
  ZeroMemory current() const;
  void sample();  // update the peaks (caller holds no lock requirement)

  std::string request_name(const char* kind, const ZeroBucket& bucket) const {
    return options.name_prefix + kind + "/" + bucket.name;
  }
};

}  // namespace kolo::detail
