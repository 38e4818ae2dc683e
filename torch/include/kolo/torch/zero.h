// ZeRO: sharded data-parallel training (Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models"; DeepSpeed; PyTorch
// FSDP) for libtorch's C++ frontend. See docs/zero.md.
//
//   torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
//   kolo::ZeroOptions zero_options;
//   zero_options.stage = 2;
//   kolo::ZeroOptimizer optimizer(adam, *model, zero_options);
//   ...
//   optimizer.zero_grad();
//   loss.backward();    // stage 2/3: each bucket's reduce-scatter starts when it is ready
//   optimizer.step();   // reduce (stage 1), update this rank's shard, allgather (stage 1/2)
//
// Partition. The parameters of the wrapped optimizer (those that require a
// gradient, in the optimizer's order) are laid end to end and cut into
// buckets: at stages 1 and 2, runs of whole parameters of about
// ZeroOptions::bucket_bytes; at stage 3, one bucket per ShardedUnit. Every
// bucket is split across the N ranks as the engine's reducescatter splits its
// first dimension: rank r owns elements [r * q + min(r, m), ...) with
// q = numel / N, m = numel % N, the first m ranks one element more. So every
// rank owns 1/N of the bytes to within one element per bucket, and a parameter
// may straddle the boundary between two ranks' slices. World size 1 is the
// same code with one slice.
//
// What each rank holds (bytes per parameter for float32 with Adam, N ranks):
//   stage 1: full parameters and full gradients, optimizer state for its
//            slices only: 4 + 4 + 8/N (12 at N = 2; DistributedOptimizer 16).
//   stage 2: full parameters; gradients only for its slices after each bucket
//            is reduce-scattered (the full .grad() of a bucket's parameters is
//            released as soon as the bucket is handed to the engine, its
//            packed copy once the reduce-scatter finished): 4 + 4/N + 8/N.
//   stage 3: its slices of parameters, gradients and optimizer state; a
//            unit's full parameters exist only from just before its forward
//            (or backward) until right after it: 4/N + 4/N + 8/N + units.
//
// Flat buffers. At every stage each bucket's parameters are views of one
// flat buffer (set_data: they stay the tensors the model and the user hold).
// At stages 1 and 2 this rank's slice is a view of that buffer, not a copy:
// the wrapped optimizer updates the parameters in place and the allgather
// after the step writes the other ranks' slices around it. At stage 1 the
// model's .grad() are views of a flat gradient buffer too (as PyTorch DDP's
// gradient_as_bucket_view): backward accumulates into it in place and the
// reduce-scatter runs in place on it, so step() leaves the gradients zero.
// Use ZeroOptimizer::zero_grad() (or Module::zero_grad() without
// set_to_none): a gradient set to none is recreated by backward and copied
// back into the buffer at step(), costing a second copy meanwhile. A
// parameter whose storage is replaced (torch::load into the model) is copied
// back into its buffer at the next step() or checkpoint. After the
// ZeroOptimizer is destroyed, the parameters (and, at stage 1, gradients)
// remain views of the buffers, which they keep alive.
//
// The wrapped optimizer. Its parameter groups are rewritten at construction:
// every group's parameters are replaced by 1-D "pieces", views of this rank's
// slices (a piece is a run of consecutive elements of parameters of that
// group). The optimizer must not have stepped before (its state must be
// empty), and its update must be element-wise (SGD, Adam, AdamW, Adagrad,
// RMSprop: the state of an element depends only on that element's history;
// LBFGS is not), or layer-wise through kolo::LayerwiseOptimizer (LARS, LAMB:
// given the layers of their pieces, they reduce per-layer norms in one
// allreduce per step). Group options (lr, weight decay...) keep working: LR
// schedulers that change a group's lr see the same groups.
//
// Collective. Construction, step(), and the checkpoint calls are collective
// over the process set; every rank passes the same model structure and the
// same options (compared with rank 0's, ContractError on every rank
// otherwise). Ranks must start from the same parameters (call
// kolo::broadcast_parameters before constructing).
//
// Not supported: gradient compression, parameters on a GPU.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/export.h"
#include "kolo/torch/checkpoint.h"
#include "kolo/torch/parallel_optimizer.h"
#include "kolo/torch/tensor.h"

namespace torch::optim {
class Optimizer;
}

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

namespace detail {
struct KOLO_HIDDEN ZeroState;
}

struct ZeroOptions : GradientOptions {
  // Defaults that differ from GradientOptions': 32 MiB buckets, requests
  // named "zero/...".
  ZeroOptions() {
    bucket_bytes = 32ll << 20;
    name_prefix = "zero/";
  }
  int stage = 1;  // 1, 2 or 3
  // bucket_bytes, stages 1 and 2: target size of a gradient / parameter
  // bucket (whole parameters; one larger parameter makes a bucket of its
  // own). Each bucket is one reduce-scatter and one allgather per step.
  // backward_passes_per_step = k: gradients accumulate in .grad() (stage 1:
  // in the flat gradient buffers) over k passes before a bucket is reduced,
  // and the reduced gradient is divided by k.
  //
  // Stage 3: while a unit runs, start gathering the unit that ran after it
  // (forward) or before it (backward) in the previous step. Costs one more
  // unit of parameter memory at the peak.
  bool prefetch = true;
};

// Bytes held by this rank (parameters, gradients, optimizer state), now and
// at the peak since construction or reset_peak(). Counted from the tensors
// kolo and the model hold, at the points where they are allocated and
// released (the peak is the largest sum seen at those points).
struct ZeroMemory {
  // Each counts the distinct storages of the tensors involved (views of one
  // flat buffer count once).
  int64_t param_bytes = 0;            // model parameters' storage + this rank's slices
  int64_t grad_bytes = 0;             // .grad() of the model + reduced slices + buffers in flight
  int64_t optimizer_state_bytes = 0;  // tensors in the wrapped optimizer's state
  int64_t peak_param_bytes = 0;
  int64_t peak_grad_bytes = 0;
  int64_t peak_optimizer_state_bytes = 0;
  int64_t peak_total_bytes = 0;  // the peak of the sum (not the sum of the peaks)
};

// Bytes of the tensors in an optimizer's per-parameter state (Adam's moments,
// SGD's momentum buffers...). Used for ZeroMemory and for comparing with an
// unsharded optimizer.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

// Stage 3's unit of sharding: wraps one submodule whose forward takes and
// returns one tensor. Its parameters, buffers and children are registered
// under the wrapped module's own names, so a model's named_parameters() (and
// its checkpoints) are the same with or without the wrapper:
//
//   fc1 = register_module("fc1", kolo::ShardedUnit(torch::nn::Linear(9216, 128)));
//
// Until a stage-3 ZeroOptimizer adopts it, a ShardedUnit just calls the
// wrapped module's forward. Once adopted, forward gathers the unit's
// parameters (allgather of every rank's slice), runs the module, and releases
// them; a hook on the output's gradient gathers them again before the unit's
// backward, and they are released once all of the unit's gradients arrived.
// Units must not nest.
class ShardedUnitImpl : public torch::nn::Module {
 public:
  template <typename ModuleType>
  explicit ShardedUnitImpl(ModuleType module) : inner_(std::move(module)) {
    adopt_children();
  }
  torch::Tensor forward(const torch::Tensor& input);
  void train(bool on = true) override;
  // The wrapped module.
  torch::nn::Module& module() const { return *inner_.ptr(); }

 private:
  // The stage-3 ZeroOptimizer adopts the unit (its constructor) and lets it go
  // (its destructor).
  friend class ZeroOptimizer;
  KOLO_HIDDEN void attach(std::weak_ptr<detail::ZeroState> state, int unit);
  KOLO_HIDDEN void detach();

  void adopt_children();
  torch::nn::AnyModule inner_;
  std::weak_ptr<detail::ZeroState> state_;
  int unit_ = -1;
};
TORCH_MODULE(ShardedUnit);

class ZeroOptimizer : public ParallelOptimizer {
 public:
  // Wraps `optimizer` (which must outlive this object and must not have
  // stepped). `model` names the parameters (model.named_parameters()), holds
  // the buffers saved with checkpoints and, at stage 3, the ShardedUnits:
  // every parameter of the optimizer must then belong to exactly one unit.
  ZeroOptimizer(torch::optim::Optimizer& optimizer, torch::nn::Module& model,
                const ZeroOptions& options = {});
  // Removes the hooks; at stage 3, gathers every unit's full parameters into
  // the model again (collective) so the model can be used without kolo.
  ~ZeroOptimizer() override;
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // synchronize() unless it ran since the last backward pass, steps the
  // wrapped optimizer on this rank's slices, and (stages 1, 2) allgathers
  // the updated slices into the model's parameters. Returns the wrapped
  // step's result. A failed collective is rethrown with the engine's message.
  torch::Tensor step() override;
  // Finishes the reduction of every bucket (submitting those backward did
  // not complete, with zeros for parameters without a gradient); afterwards
  // the wrapped optimizer's parameters (this rank's pieces) have the reduced
  // gradients in .grad().
  void synchronize() override;
  // Releases (stage 2, 3) or zeroes (stage 1) the model's gradients, and
  // local accumulation restarts. ContractError while a reduce-scatter started
  // by backward() is unwaited or a gradient of this step waits in a bucket.
  void zero_grad() override;

  // Stage 3: gathers every unit's full parameters into the model (e.g. for
  // evaluation with a plain module or a non-kolo checkpoint) until
  // release_parameters(). Collective.
  void gather_parameters();
  void release_parameters();

  ZeroMemory memory() const;
  void reset_peak();

  const ZeroOptions& options() const;
  int zero_stage() const override;
  int rank() const override;        // in the process set
  int world_size() const override;  // of the process set
  torch::optim::Optimizer& optimizer() override { return optimizer_; }
  torch::nn::Module& model() { return model_; }

  // Buckets as (request name, elements, this rank's first element, this
  // rank's elements), in flat order.
  struct BucketInfo {
    std::string name;
    int64_t numel = 0;
    int64_t shard_begin = 0;
    int64_t shard_numel = 0;
  };
  std::vector<BucketInfo> buckets() const;

 private:
  // The sharded checkpoint reads and restores the shards' internals.
  friend void save_zero_checkpoint(const std::string& dir, ZeroOptimizer& optimizer,
                                   const CheckpointState& state);
  friend CheckpointState load_zero_checkpoint(const std::string& dir, ZeroOptimizer& optimizer);
  detail::ZeroState& state() { return *state_; }

  void save(const std::string& dir, const CheckpointState& state) override;
  CheckpointState load(const std::string& dir) override;

  torch::optim::Optimizer& optimizer_;
  torch::nn::Module& model_;
  std::shared_ptr<detail::ZeroState> state_;
};

// --- Sharded checkpoints ----------------------------------------------------
//
// A checkpoint is a directory: "shard-<r>-of-<N>-<save id>.kolo" per rank (its
// slices of the parameters and of the optimizer state, by parameter name and
// element range) and "index.kolo" (world size, stage, parameter manifest,
// optimizer type and group options, the model's buffers, CheckpointState, and
// the names of its shards). Every file uses kolo's checkpoint container
// (kolo/torch/checkpoint.h): written to a temporary file and renamed, with
// CRC-32s checked on reading. A save writes new shard files beside the last
// save's, then the index, last, by rank 0, once every shard is on disk: the
// index's rename commits the save, and only then are the older shards
// removed. A save that fails on any rank (a full disk) throws on every rank
// and leaves the last complete save in place.
//
// Loading works at any world size and stage: each rank reads the index and the
// shards that hold its new slices. A consolidated checkpoint is the same
// format with one shard holding everything (consolidate_zero_checkpoint or the
// kolo-zero-consolidate tool).

// Collective. Writes `dir` (created if missing).
void save_zero_checkpoint(const std::string& dir, ZeroOptimizer& optimizer,
                          const CheckpointState& state = {});
// Collective. Restores parameters, buffers, optimizer state and group options;
// returns the saved state (rng_restored is false: generator states are not
// part of ZeRO checkpoints). A missing or corrupt file is a ContractError on
// every rank naming the file and the rank that found it.
CheckpointState load_zero_checkpoint(const std::string& dir, ZeroOptimizer& optimizer);

// One process: reads every shard of `dir` and writes `out_dir` with one shard
// ("shard-0-of-1-<save id>.kolo") holding the full parameters and optimizer state.
void consolidate_zero_checkpoint(const std::string& dir, const std::string& out_dir);

// One process: loads the full parameters and buffers of a ZeRO checkpoint
// (sharded or consolidated) into a plain model, e.g. for inference.
CheckpointState load_zero_model(const std::string& dir, torch::nn::Module& model);

}  // namespace kolo
#pragma GCC visibility pop
