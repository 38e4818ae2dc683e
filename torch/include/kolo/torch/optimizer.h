// DistributedOptimizer: data-parallel training with any torch::optim
// optimizer (Horovod's hvd.DistributedOptimizer for libtorch's C++ frontend).
//
//   torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
//   kolo::DistributedOptimizer optimizer(adam, model->named_parameters());
//   ...
//   optimizer.zero_grad();
//   loss.backward();    // gradients' allreduces start as buckets of them are ready
//   optimizer.step();   // waits for them, then steps `adam`
//
// The gradient pipeline (docs/torch.md; the same component serves every
// ZeRO stage). The constructor registers hooks on every parameter's gradient
// accumulator. backward() produces gradients from the last layer to the
// first; once every gradient of a bucket is written, the bucket's allreduces
// are handed to the engine (one request "grad/<name>" per gradient, fused by
// the engine), which negotiates and reduces on its own thread while
// backward() goes on computing the earlier layers' gradients. step() waits
// for every allreduce, writes the results into .grad() and then steps the
// wrapped optimizer.
//
// Buckets. The parameters are laid out in buckets (one dtype each) in the
// order backward() makes their gradients ready: reverse parameter order until
// the first step, then the order rank 0's gradients became ready in it (DDP's
// bucket rebuild; gathered with the first step's allreduces, so it costs no
// extra synchronisation). A bucket closes once it holds bucket_bytes (default
// 25 MiB, as DDP's bucket_cap_mb); bucket_bytes = 0 puts every gradient in a
// bucket of its own. A bucket goes to the engine when its last gradient is
// ready: a model whose gradients add up to less than bucket_bytes is reduced
// in one fused allreduce at the end of backward(); a large one overlaps
// bucket by bucket. buckets() lists the layout.
// Why: overlap only pays where the communication has spare CPU or a network
// to run on. On hosts where every core runs compute (kolorun's default: the
// cores divided among the local workers) a gradient reduced during backward
// takes CPU from it, and its allreduce is cut into many peer
// synchronisations, each one a wake-up and a context switch on a busy core.
// Which layout is faster depends on the model and the host: docs/
// benchmarks.md has the measurements.
//
// Every step, every rank submits the same set of gradients: all parameters of
// the wrapped optimizer that require a gradient when the DistributedOptimizer
// is constructed (parameters with requires_grad == false are skipped on every
// rank; the set is fixed at construction, so build a new DistributedOptimizer
// after freezing or unfreezing parameters).
//
// Parameters without a gradient this step. A parameter whose hook did not fire
// (a branch of the model not taken on this rank, a layer unused this step)
// keeps its bucket from going inside backward(); step() submits that bucket,
// the parameter with its current .grad(), or with zeros if .grad() is
// undefined (the zeros are stored in .grad()). So no rank waits for a gradient
// another rank never sends (the "Expected to have finished reduction" failure
// of DDP and Horovod), and after step() every such parameter holds the average
// of the other ranks' gradients. As a consequence, a parameter that no rank
// used still gets a defined, all-zero gradient and the wrapped optimizer steps
// it (SGD without momentum or weight decay leaves it unchanged; Adam's moments
// decay), where a single process would have skipped it. libtorch 1.13's
// zero_grad() keeps gradients defined (it fills them with zeros), so in the
// usual loop .grad() is zeros rather than undefined anyway.
//
// Local accumulation. With backward_passes_per_step = k, gradients accumulate
// locally in .grad() over k backward passes (as without kolo) and a
// parameter's gradient joins a bucket in its k-th pass; the result is divided
// by k (Horovod's average_aggregated_gradients), so k passes over batches of B
// followed by step() equal one step on a batch of k * B when each pass's loss
// is a mean over its batch. A gradient computed once more after its k-th pass
// (its allreduce started or queued) is a ContractError from backward(); step()
// after fewer than k passes submits what has accumulated (still divided by k).
//
// Scaling. op = kAverage: prescale 1 / (f * k), postscale f, and the engine
// divides by the number of ranks, where f = gradient_predivide_factor
// (Horovod's semantics: dividing part before the sum keeps fp16 sums in
// range). op = kSum: prescale 1 / k, no division by the ranks.
//
// Communication hooks (comm_hook.h, DDP's register_comm_hook): with
// options.comm_hook set, each bucket is packed into a flat buffer and handed
// to the hook, which returns the future of the reduced bucket (built in:
// allreduce_hook, fp16/bf16_compress_hook, powersgd_hook; or your own).
// step() waits for the buckets' futures in bucket order, the same on every
// rank (a hook's later collectives are started by that wait), and copies
// each result into the gradients. The hook's state is saved and restored
// with the optimizer by kolo::save_checkpoint / kolo::load_checkpoint.
//
// Bucket views. With options.gradient_as_bucket_view, every parameter's
// .grad() is a tensor on its bucket's flat buffer (at the parameter's offset,
// shaped like it) from construction on: zeros where the gradient was
// undefined, a copy where it was defined. libtorch's AccumulateGrad adds a
// new gradient in place into a defined .grad() (any backward without
// create_graph), so backward writes straight into the bucket, and a bucket
// goes to the engine as one allreduce request ("<prefix>bucket<i>") computed
// in place on the buffer, or is the buffer handed to the communication hook:
// nothing is packed or unpacked. zero_grad() (the wrapped optimizer's, or
// Module::zero_grad()) zeroes the buffer in place. A gradient that is no
// longer in its slot (set to none, replaced by the user or by a create_graph
// backward) is copied back into it when its bucket is launched and .grad()
// points to the slot again (stats().copies counts such copies). When the
// layout is rebuilt after the first step, the gradients move to the new
// buffers (one copy, once). Not a view in autograd's sense: detach_() works
// on it, so the wrapped optimizer's zero_grad() keeps it in place.
//
// Compression. kFp16 / kBf16 install fp16_compress_hook / bf16_compress_hook:
// a bucket of float32 or float64 gradients is cast to that dtype, reduced in
// it and cast back by step(). Halves the bytes sent; costs precision (fp16
// keeps about 3 decimal digits, bf16 about 2). Buckets of other dtypes are
// sent as they are.
//
// Threads. backward() and the calls below must come from one thread at a
// time (the usual training loop). At world size 1 the same code runs: every
// gradient still goes through the engine (which then copies nothing).
//
// Errors. A failed allreduce (a dead peer, a mismatch) is rethrown by step()
// with the engine's message, which names the gradient and the ranks; the
// optimizer is not stepped, and the DistributedOptimizer is ready for the
// next step.
#pragma once

#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/core/dtype.h"
#include "kolo/core/export.h"
#include "kolo/torch/comm_hook.h"
#include "kolo/torch/parallel_optimizer.h"
#include "kolo/torch/tensor.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

namespace detail {
struct ReplicatedCheckpoint;
}

enum class Compression {
  kNone,
  kFp16,  // IEEE half
  kBf16,  // bfloat16
};

// "none", "fp16", "bf16"; ContractError listing them otherwise.
Compression parse_compression(const std::string& name);
const char* compression_name(Compression compression);

struct DistributedOptimizerOptions : GradientOptions {
  // backward_passes_per_step: see "Local accumulation" above.
  // bucket_bytes: gradients go to the engine in buckets of at least this
  // many bytes (as sent, i.e. after compression), laid out in the order
  // backward() makes them ready; 0 = each gradient alone, the moment it is
  // ready. See "Buckets" above for why the default is DDP's 25 MiB.
  ReduceOp op = ReduceOp::kAverage;              // kAverage or kSum
  Compression compression = Compression::kNone;  // kFp16 / kBf16: a compress hook
  double gradient_predivide_factor = 1.0;        // f > 0; != 1 only with kAverage
  // What is done with each bucket (comm_hook.h); nullptr = one allreduce
  // request per gradient, fused by the engine. Not with compression (which
  // is a hook itself).
  std::shared_ptr<CommHook> comm_hook;
  // Gradients as bucket views (DDP's gradient_as_bucket_view; see "Bucket
  // views" above): each parameter's .grad() lies in its bucket's flat buffer,
  // backward accumulates straight into it and a bucket is one in-place
  // allreduce (or the hook's buffer), with no pack or unpack copy. Off by
  // default, as in DDP: .grad() is then defined (zeros) from construction,
  // shares its storage with the bucket's other gradients, and is re-pointed
  // to a new buffer when the layout is rebuilt after the first step.
  bool gradient_as_bucket_view = false;
};

class DistributedOptimizer : public ParallelOptimizer {
 public:
  // Wraps `optimizer` (which must outlive this object). Every parameter of
  // the optimizer's groups needs a name from `named_parameters` (typically
  // model->named_parameters()); names not in the optimizer are ignored.
  //
  // Collective: every rank of the process set constructs its
  // DistributedOptimizer at the same point of the program. The ranks compare
  // their parameters (names, dtypes, shapes, requires_grad) with rank 0's of
  // the set; any difference, a parameter without a name, a duplicate name or
  // an invalid option is a ContractError on every rank.
  DistributedOptimizer(torch::optim::Optimizer& optimizer,
                       const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
                       const DistributedOptimizerOptions& options = {});
  DistributedOptimizer(torch::optim::Optimizer& optimizer,
                       const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
                       const DistributedOptimizerOptions& options = {});
  // Names from model.named_parameters(); the model (which must outlive this
  // object) is also what kolo::save_checkpoint(dir, optimizer, state) saves.
  DistributedOptimizer(torch::optim::Optimizer& optimizer, torch::nn::Module& model,
                       const DistributedOptimizerOptions& options = {});
  // Without names: parameter j of group g is named "<g>.<j>".
  explicit DistributedOptimizer(torch::optim::Optimizer& optimizer,
                                const DistributedOptimizerOptions& options = {});
  // Synchronize only: exchanges the gradients of `named_parameters` (every
  // one that requires a gradient, in the given order) for an optimizer kolo
  // does not see (the Python frontend's). synchronize() and zero_grad() work
  // as below (zero_grad() zeroes the gradients itself); step() and
  // optimizer() are ContractErrors.
  explicit DistributedOptimizer(
      const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
      const DistributedOptimizerOptions& options = {});
  // Removes the hooks. Allreduces still running keep their tensors alive and
  // finish on their own; call step() or synchronize() first to use them.
  ~DistributedOptimizer() override;
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Waits for every gradient's allreduce (submitting those whose hook has
  // not fired, see above), writes the results into .grad(), then steps the
  // wrapped optimizer. Returns what the wrapped step returns. If synchronize()
  // was called since the last backward pass, does not synchronize again (so
  // gradients can be clipped in between, as with Horovod).
  torch::Tensor step() override;
  // The first half of step(): after it, every parameter's .grad() holds the
  // reduced gradient.
  void synchronize() override;
  // The wrapped optimizer's zero_grad(), and local accumulation restarts.
  // ContractError if allreduces started by backward() have not been waited
  // for by step() or synchronize() (they still write into the gradients), or
  // if a gradient of this step waits in a bucket (the same on every rank,
  // whatever bucket_bytes is). Between the passes of a local accumulation
  // (fewer than backward_passes_per_step) it is allowed and restarts it.
  void zero_grad() override;

  torch::optim::Optimizer& optimizer() override;
  int zero_stage() const override { return 0; }
  int rank() const override;
  int world_size() const override;
  const DistributedOptimizerOptions& options() const;
  // The request names, in the order of the wrapped optimizer's parameters
  // (skipped parameters are not listed).
  std::vector<std::string> gradient_names() const;
  // The buckets, as request names of their gradients, in the order their
  // exchange starts when backward() produces every gradient: reverse
  // parameter order until the first step, then the order in which rank 0's
  // gradients became ready in it.
  std::vector<std::vector<std::string>> buckets() const;

  // Counters since construction.
  struct Stats {
    uint64_t steps = 0;             // synchronizations completed
    uint64_t hook_submissions = 0;  // allreduces started by a hook, inside backward
    uint64_t step_submissions = 0;  // allreduces started by step() / synchronize()
    uint64_t zero_filled = 0;       // of those, gradients that were undefined (sent as zeros)
    // Copies of a gradient between .grad() and a buffer kolo made: packing a
    // bucket for a hook, unpacking its result, a non-contiguous gradient's
    // staging copy, or moving a gradient into its bucket view. With
    // gradient_as_bucket_view and gradients left in place: none per step.
    uint64_t copies = 0;
    uint64_t copied_bytes = 0;
  };
  Stats stats() const;

 private:
  void save(const std::string& dir, const CheckpointState& state) override;
  CheckpointState load(const std::string& dir) override;

  struct KOLO_HIDDEN Impl;
  // The collective check and the pipeline, after a constructor collected the
  // parameters, their groups in the wrapped optimizer, and an error to
  // report on every rank ("" if none).
  void build(const std::vector<std::pair<std::string, torch::Tensor>>& params,
             const std::vector<int>& groups, std::string error);
  detail::ReplicatedCheckpoint checkpoint_of(const char* call);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kolo
#pragma GCC visibility pop
