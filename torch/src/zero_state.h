// ZeroOptimizer's shared state (internal): the partition into buckets and
// slices, the pieces handed to the wrapped optimizer, and the stage-3 units.
// Used by zero_partition.cc, zero_optimizer.cc, zero_unit.cc,
// zero_checkpoint.cc and zero_memory.cc.
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
#include "kolo/torch/tensor.h"
#include "kolo/torch/zero.h"

namespace torch::optim {
class Optimizer;
}

namespace kolo::detail {

// Rank r's slice of a bucket of `numel` elements split over `n` ranks, as the
// engine's reducescatter splits dim 0: (first element, elements).
std::pair<int64_t, int64_t> slice_of(int64_t numel, int n, int r);

// One parameter of the wrapped optimizer.
struct ZeroParam {
  std::string name;  // model.named_parameters() name
  torch::Tensor param;
  int group = 0;       // parameter group of the wrapped optimizer
  int bucket = 0;      // the bucket holding it
  int64_t offset = 0;  // first element within the bucket
  int64_t numel = 0;
  // Stages 2 and 3: the AccumulateGrad node and our hook on it.
  std::shared_ptr<torch::autograd::Node> accumulator;
  uintptr_t post_hook_key = 0;
  bool hooked = false;
  bool ready = false;  // its gradient of this step arrived
};

// Parameter p's place in a (numel) flat buffer of its bucket, shaped like p.
inline torch::Tensor slot_of(const torch::Tensor& flat, const ZeroParam& p) {
  return flat.narrow(0, p.offset, p.numel).view(p.param.sizes());
}

// Whether `t` is exactly the memory of `slot` (same first element, shape and
// contiguous layout): a parameter or gradient still in its flat buffer.
inline bool occupies(const torch::Tensor& t, const torch::Tensor& slot) {
  return t.defined() && t.data_ptr() == slot.data_ptr() && t.sizes() == slot.sizes() &&
         t.is_contiguous();
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

// One bucket: consecutive parameters of one dtype, laid end to end in a flat
// buffer and split across the ranks (slice_of). Which buffers exist:
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
  torch::Tensor full;        // (numel) the parameters' storage (see above)
  int64_t full_nbytes = 0;   // bytes of `full` when it holds the parameters
  torch::Tensor shard;       // (shard_numel) this rank's parameter slice (authoritative)
  torch::Tensor grad_shard;  // (shard_numel) reduced gradient of the slice
  torch::Tensor flat_grad;   // stage 1: (numel) the parameters' gradients, reduced in place
  torch::Tensor full_grad;   // stages 2, 3: (numel) packed gradients being reduce-scattered
  Handle reduce;             // the reduce-scatter into grad_shard
  bool submitted = false;
  uint64_t submitted_seq = 0;  // order of submission (stages 2, 3: which is oldest)
  int ready = 0;               // parameters whose gradient arrived this step

  // Stage 3: the unit's parameters are views of `full`, whose storage is
  // released (0 bytes) while the unit is not in use.
  int unit = -1;
  Handle gather;  // allgather of the slices into full
  bool gathering = false;
  bool gathered = false;  // full holds the parameters (after gather completed)
};

struct ZeroState {
  ZeroOptions options;
  Engine* engine = nullptr;
  CallOptions call;
  RequestOptions request;  // set, op = average
  int rank = 0;
  int size = 1;
  torch::optim::Optimizer* optimizer = nullptr;
  torch::nn::Module* model = nullptr;

  std::mutex mutex;  // hooks (autograd thread) vs the training thread
  std::vector<ZeroParam> params;
  std::vector<ZeroBucket> buckets;
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

  // --- zero_optimizer.cc ---
  void after_accumulate(size_t param);  // hook, stages 2 and 3
  void submit_reduce(ZeroBucket& bucket);
  // Stages 2, 3, inside backward: free the gradients of finished reductions;
  // with `keep` = bucket just submitted, wait until no other is in flight.
  void reap_reductions(const ZeroBucket* keep = nullptr);
  uint64_t submissions = 0;  // counter for ZeroBucket::submitted_seq
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
