// The gradient pipeline (internal): the one component between autograd and
// the engine, under DistributedOptimizer and every stage of ZeroOptimizer.
//
// It owns:
//  - the parameters whose gradients are exchanged, and two hooks on each
//    one's AccumulateGrad node: before accumulation (a gradient computed
//    after its k-th pass is refused before it touches .grad()) and after it
//    (count the pass; on the k-th pass the gradient is ready);
//  - pass counting for backward_passes_per_step = k;
//  - the layout: every parameter lies in one bucket (one dtype) at an
//    element offset, so a bucket can be a flat buffer with a slot per
//    parameter (pack / unpack / views below);
//  - readiness per step: a bucket whose parameters are all ready is handed
//    to the policy (Policy::launch) from inside backward; the order in which
//    gradients became ready is kept (data parallelism lays its buckets out
//    by it);
//  - finish(): the buckets backward did not complete are launched (a
//    parameter without a gradient is sent as zeros: the documented zero-fill),
//    every launched bucket is waited for with a bound on how many are in
//    flight, and the step's state is reset;
//  - hook removal.
//
// A policy decides the layout, what launching a bucket means and what to do
// when its exchange finished: DistributedOptimizer allreduces (buckets laid
// out by readiness), ZeroOptimizer reduce-scatters (buckets = its flat shard
// buffers).
//
// Threads: the hooks run on the thread that runs backward(); every method
// below takes `mutex` unless it says the caller holds it.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kolo/core/engine.h"
#include "kolo/torch/compat.h"

namespace kolo::detail {

// One parameter whose gradient the pipeline exchanges.
struct GradParam {
  std::string name;  // the model's name of the parameter (model.named_parameters())
  torch::Tensor param;
  int group = 0;       // parameter group of the wrapped optimizer
  int bucket = -1;     // the bucket holding it
  int64_t offset = 0;  // first element within the bucket
  int64_t numel = 0;
  int passes = 0;  // backward passes that produced its gradient since the last exchange
  // The AccumulateGrad node, held so that the same node (and our hooks on it)
  // serves every backward pass: otherwise it dies with each step's graph and
  // the next forward creates one without hooks (DDP's reducer does the same).
  compat::NodePtr accumulator;
  torch::autograd::FunctionPreHook* pre_hook = nullptr;
  uintptr_t post_hook_key = 0;
};

// One bucket: parameters of one dtype and device laid end to end.
struct GradBucket {
  std::string name;
  std::vector<int> params;  // indices into GradientPipeline::params, in flat order
  int64_t numel = 0;
  c10::ScalarType dtype = torch::kFloat;
  torch::Device device = torch::kCPU;
  // The options of a flat buffer of the bucket (its dtype, on its device).
  torch::TensorOptions options() const {
    return torch::TensorOptions().dtype(dtype).device(device);
  }
  int ready = 0;          // parameters whose gradient is final for this step
  bool launched = false;  // its exchange started this step (finish() resets it)
  bool done = false;      // ...and finished (its requests were waited for)
  uint64_t launch_seq = 0;
  std::vector<Handle> work;  // the requests Policy::launch started
  std::exception_ptr error;  // the first failure of launching or waiting
};

// What happens to a gradient after pack() copied it into its slot.
enum class AfterPack {
  kKeep,     // .grad() stays as it was
  kView,     // .grad() becomes the slot (the bucket's memory; grad_slot below)
  kRelease,  // .grad() becomes undefined (the bucket holds the only copy)
};

struct PipelineStats {
  uint64_t exchanges = 0;        // finish() calls that succeeded
  uint64_t hook_launched = 0;    // gradients launched from a hook, inside backward
  uint64_t finish_launched = 0;  // gradients launched by finish()
  uint64_t zero_filled = 0;      // gradients that were undefined, sent as zeros
  // Copies between a .grad() and a bucket's flat buffer made by pack() and
  // unpack() (a gradient already in its slot costs none), and bytes copied.
  uint64_t copies = 0;
  uint64_t copied_bytes = 0;
};

class GradientPipeline {
 public:
  class Policy {
   public:
    virtual ~Policy() = default;
    // Bucket b's gradients are final for this step: start its exchange and
    // put its requests into buckets[b].work. `in_backward`: called from a
    // hook (backward goes on computing earlier layers meanwhile); else from
    // finish(). Caller holds the mutex.
    virtual void launch(int b, bool in_backward) = 0;
    // Bucket b's requests finished (`ok`: none failed): move results into
    // place, free what the exchange needed. Once per launched bucket, from
    // finish() or wait_for_others(). Caller holds the mutex. May block and
    // throw (a hook's future): the error becomes the bucket's.
    virtual void finished(int b, bool ok) = 0;
  };

  struct Options {
    std::string op;  // "kolo::DistributedOptimizer": errors start with it
    // Errors name a parameter's gradient as name_prefix + its name (data
    // parallelism: the request name, "grad/fc.weight").
    std::string name_prefix;
    int backward_passes_per_step = 1;
    std::string exchange = "allreduce";  // what a launch starts, in errors
    // Whether a bucket complete inside backward is launched there (false:
    // everything waits for finish(); the hooks still count passes).
    bool launch_in_backward = true;
    // The advice ending the error for a gradient computed after its k-th pass.
    std::string too_many_passes;
    // How long each wait for a request may take before TimeoutError (0 = no
    // limit of its own, CallOptions').
    std::chrono::milliseconds timeout{0};
    // finish() waits for the launched buckets in bucket order instead of
    // launch order: when Policy::finished starts collectives of its own (a
    // communication hook's later stages), every rank must reach them in the
    // same order, and the readiness order differs between ranks. Only with
    // an unbounded max_in_flight (finish() then waits after launching all).
    bool complete_in_bucket_order = false;
  };

  GradientPipeline(Options options, Policy& policy);
  // Removes the hooks (remove_hooks()).
  ~GradientPipeline();
  GradientPipeline(const GradientPipeline&) = delete;
  GradientPipeline& operator=(const GradientPipeline&) = delete;

  mutable std::mutex mutex;  // hooks vs the training thread
  std::vector<GradParam> params;
  std::vector<GradBucket> buckets;

  const Options& options() const { return options_; }

  // Adds a parameter (before set_layout); returns its index.
  int add(const std::string& name, const torch::Tensor& param, int group = 0);
  // The bucket of every parameter: lists of parameter indices, each of one
  // dtype, every parameter in exactly one. Buckets are named "b<i>" (the
  // policy may rename them). Only between steps (nothing launched or ready).
  void set_layout(const std::vector<std::vector<int>>& layout);
  // Registers the hook pair on every parameter. `self` must point to this
  // pipeline (an aliasing pointer into its owner): a hook that outlives the
  // owner does nothing.
  void install_hooks(const std::weak_ptr<GradientPipeline>& self);
  void remove_hooks();
  bool hooked() const { return hooked_; }

  // --- Flat buffers of a bucket ----------------------------------------------
  // Parameter i's place in a flat (numel) buffer of its bucket, shaped like it.
  torch::Tensor slot(const torch::Tensor& flat, int i) const;
  // Parameter i's slot as a gradient: the same memory as slot(flat, i), but
  // not an autograd view of `flat` (a tensor set_() on its storage), because
  // libtorch 1.13's Optimizer::zero_grad() calls detach_() on every .grad(),
  // which a view refuses ("Can't detach views in-place"); detach_() and
  // zero_() on this one keep it in the slot.
  torch::Tensor grad_slot(const torch::Tensor& flat, int i) const;
  // Whether `t` is exactly the memory of `slot` (a gradient or parameter
  // still in its flat buffer). Never true of a sparse tensor.
  static bool occupies(const torch::Tensor& t, const torch::Tensor& slot);
  // Sparse gradients (nn.Embedding(sparse=true), a sparse COO .grad()) are
  // exchanged dense, as Horovod's sparse_as_dense: `to_dense` writes the
  // gradient into the dense `target` of its shape (a sparse one summed into
  // zeros, duplicates included); `write_back` puts the reduced dense `result`
  // into the .grad() `grad` it came from: copied into a dense one, a new
  // sparse tensor of the same sparse_dim for a sparse one (holding the rows
  // that are not all zero after the reduction).
  static void to_dense(const torch::Tensor& target, const torch::Tensor& grad);
  static void write_back(torch::Tensor& grad, const torch::Tensor& result);
  // Copies each gradient of bucket b into its slot of `flat` (converting the
  // dtype; zeros for an undefined gradient, counted as zero-filled), except a
  // gradient that already is its slot; then treats .grad() as `after` says.
  // Counts the copies (stats()). A sparse gradient is densified (to_dense);
  // AfterPack::kView refuses one (a view of the buffer cannot be sparse).
  void pack(int b, const torch::Tensor& flat, AfterPack after);
  // Copies each slot of `flat` into its parameter's .grad() (converting),
  // except where .grad() is that slot (write_back: a sparse .grad() is
  // replaced). Gradients must be defined. Counts the copies.
  void unpack(int b, const torch::Tensor& flat);
  // .grad() of parameter i, or zeros shaped like the parameter if it is
  // undefined (counted as zero-filled; stored in .grad() when `store`).
  torch::Tensor gradient_or_zeros(int i, bool store);
  // Caller holds the mutex (or no hook can run yet). Makes the .grad() of
  // every parameter of bucket b its grad_slot of `flat` (the bucket's (numel)
  // buffer), copying a defined gradient that lies elsewhere into it (counted)
  // and zeroing the slot of an undefined one: gradients as bucket views
  // (docs/torch.md). Only between steps.
  void point_grads(int b, const torch::Tensor& flat);
  // Caller holds the mutex. Counts a copy of `bytes` made outside pack() and
  // unpack() (a policy's staging buffer).
  void count_copy(int64_t bytes);

  // --- The step --------------------------------------------------------------
  // Launches the buckets backward did not complete, last bucket first (the
  // order backward would have produced them), then waits for every launched
  // bucket, oldest first, keeping at most `max_in_flight` (>= 1) in flight;
  // resets the step (passes, readiness) and rethrows the first error.
  void finish(size_t max_in_flight);
  // Caller holds the mutex. Marks finished buckets done (Policy::finished)
  // and waits for every launched one other than `keep`, oldest first: a
  // policy that must not have two buckets in flight inside backward calls it
  // before launching `keep`. A failure stays in the bucket for finish().
  void wait_for_others(int keep);
  // Whether finish() ran and no gradient arrived since.
  bool exchanged() const;
  void clear_exchanged();
  // ContractError "<op>::<call>: ..." if a bucket's exchange was launched and
  // not finished, or a gradient is final for this step but still waits in an
  // incomplete bucket (whether it left its bucket depends on the layout and
  // on which parameters a rank used, so both are refused alike). Otherwise
  // restarts the step: passes and readiness back to zero.
  void restart(const std::string& call);
  // Caller holds the mutex. Whether any bucket was launched and not finished.
  bool in_flight() const;

  // This step's parameters whose gradient is final, in the order they became so.
  std::vector<int> order() const;
  PipelineStats stats() const;

 private:
  void before_accumulate(size_t index);
  void after_accumulate(size_t index);
  void launch(int b, bool in_backward);  // caller holds the mutex
  void complete(int b);                  // caller holds the mutex: wait, Policy::finished
  void reset();                          // caller holds the mutex
  std::string describe(const GradBucket& bucket) const;
  std::string shown(const GradParam& p) const { return options_.name_prefix + p.name; }

  friend class PipelinePreHook;
  friend class PipelinePostHook;

  Options options_;
  Policy& policy_;
  bool hooked_ = false;
  bool exchanged_ = false;
  uint64_t launches_ = 0;
  std::vector<int> order_;  // this step's readiness order
  PipelineStats stats_;
};

}  // namespace kolo::detail
