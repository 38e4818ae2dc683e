// Communication hooks (DDP's register_comm_hook): what a DistributedOptimizer
// does with each bucket of gradients.
//
//   kolo::PowerSGDOptions psgd;
//   psgd.rank = 2;           // rank of the low-rank approximation
//   psgd.start_step = 100;   // plain allreduce before (the first steps move fast)
//   kolo::DistributedOptimizerOptions o;
//   o.comm_hook = kolo::powersgd_hook(psgd);
//   kolo::DistributedOptimizer optimizer(sgd, *model, o);
//
// A hook runs once per bucket per step, when the bucket's last gradient is
// ready (inside backward(), or in step() / synchronize() for a bucket
// backward did not complete), on the thread that runs them. It receives the
// bucket's flat gradient (CommBucket::buffer: this rank's gradients of the
// step laid end to end, already divided by backward_passes_per_step) and
// returns a CommFuture of the reduced one: a 1-D tensor of the buffer's
// numel and dtype (the buffer itself, reduced in place, is fine), which
// step() waits for and copies into the parameters' .grad(). A hook uses the
// engine's collectives through the frontend's calls with
// CommBucket::reduce (engine, process set, timeout, op and scales: an
// allreduce with these options gives what the default exchange gives) and
// names its requests after CommBucket::name, which is the same on every rank.
// It may keep state across steps (per bucket: CommBucket::index); that state
// goes into kolo::save_checkpoint through save_state() / load_state().
//
// Every rank installs the same hook: describe() is compared across the ranks
// when the DistributedOptimizer is built (a difference is a ContractError on
// every rank). ZeroOptimizer reduce-scatters its flat shard buffers and takes
// no hook: make_parallel_optimizer rejects comm_hook at zero_stage 1-3.
//
// Without a hook (comm_hook == nullptr, the default) each gradient of a
// bucket is its own allreduce request, which the engine fuses and on shm
// reduces in place: the same result as allreduce_hook(), without the copy
// into a flat buffer and back that every hook costs.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/export.h"
#include "kolo/torch/tensor.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// One bucket of one step, as a hook sees it.
struct CommBucket {
  // The bucket's position in the layout. DistributedOptimizer lays its
  // buckets out again once, after the first step (by readiness), so state
  // kept per index should start after step 0 (PowerSGD's start_step >= 1).
  int index = 0;
  int64_t step = 0;   // synchronizations completed before this one
  bool last = false;  // the last bucket this step's exchange starts
  // Prefix for this bucket's request names, the same on every rank
  // ("<name_prefix>bucket<index>").
  std::string name;
  // This rank's gradients, 1-D, the bucket's dtype; the hook may overwrite it.
  torch::Tensor buffer;
  // The parameters in buffer order: names, shapes and first element.
  std::vector<std::string> parameters;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> offsets;
  // The default exchange's request options.
  TensorOpOptions reduce;
  int rank = 0;  // this rank's index in the process set
  int size = 1;  // ranks in the process set

  // Views of `buffer` shaped like the parameters, in buffer order.
  std::vector<torch::Tensor> gradients() const;
};

// The future of a hook's result: an engine request's, one already computed,
// or a continuation that runs (on the thread that waits) once another
// future's value is there and may start more collectives.
class CommFuture {
 public:
  CommFuture() = default;
  explicit CommFuture(TensorHandle handle);  // the request's result tensor
  static CommFuture ready(torch::Tensor value);
  // `next` gets this future's value and returns the next future.
  CommFuture then(std::function<CommFuture(torch::Tensor)> next) const;
  // ...or the final value.
  CommFuture then_value(std::function<torch::Tensor(torch::Tensor)> next) const;

  bool valid() const { return state_ != nullptr; }
  // Blocks until the value is there (each request waits at most `timeout`,
  // 0 = no limit of its own) and returns it; rethrows a failure. Only the
  // first call computes; later ones return the same value or error.
  torch::Tensor wait(std::chrono::milliseconds timeout = std::chrono::milliseconds{0}) const;

 private:
  struct KOLO_HIDDEN State;
  std::shared_ptr<State> state_;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  // The hook and its settings, compared across ranks ("powersgd rank=2 ...").
  virtual std::string describe() const = 0;
  // Starts the exchange of `bucket` and returns the future of its result.
  virtual CommFuture run(CommBucket& bucket) = 0;
  // This rank's state across steps as bytes ("" = none), saved with the
  // optimizer by kolo::save_checkpoint (every rank's), and handed back by
  // kolo::load_checkpoint to the same rank when the checkpoint has as many
  // ranks (otherwise the hook keeps its fresh state).
  virtual std::string save_state() const { return {}; }
  virtual void load_state(const std::string& /*bytes*/) {}
};

// A hook from a function (no state to checkpoint). `description` is what the
// ranks compare.
std::shared_ptr<CommHook> make_comm_hook(std::string description,
                                         std::function<CommFuture(CommBucket&)> run);

// The default exchange on the flat bucket: one allreduce with bucket.reduce.
std::shared_ptr<CommHook> allreduce_hook();
// The bucket is cast to float16 / bfloat16, allreduced in it, and cast back
// (half the bytes; fp16 keeps about 3 significant digits, bf16 about 2).
// Buckets of other than float32/float64 are allreduced as they are.
// A float32 bucket's 16-bit copy is kept between steps (memory: half the
// bucket's bytes per bucket), so that no step allocates it afresh.
// DistributedOptimizerOptions::compression kFp16 / kBf16 installs these.
std::shared_ptr<CommHook> fp16_compress_hook();
std::shared_ptr<CommHook> bf16_compress_hook();

// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019), as torch's
// powerSGD_hook: each gradient of two or more dimensions, seen as an n x m
// matrix M (dim 0 by the rest), is sent as rank-r factors: P = M Q,
// allreduce P, orthonormalise P, Q = M^T P, allreduce Q, and every rank
// uses P Q^T; r (n + m) numbers instead of n m. Gradients where that saves
// less than min_compression_rate, and 1-D ones (biases), are allreduced
// uncompressed in one request. Error feedback: what the approximation missed
// on this rank (M - P Q^T) is added to its next gradient. Warm start: Q is
// kept from the previous step (one power iteration per step refines it),
// the first from a generator seeded with `seed`, the same on every rank.
// Before step start_step every bucket is allreduced uncompressed.
struct PowerSGDOptions {
  int rank = 1;            // r >= 1; clamped to min(n, m) per gradient
  int64_t start_step = 1;  // >= 1 (the layout changes after step 0)
  bool error_feedback = true;
  bool warm_start = true;
  double min_compression_rate = 2;  // n m / (r (n + m)) needed to compress
  uint64_t seed = 0;
};

class PowerSGDHook : public CommHook {
 public:
  explicit PowerSGDHook(const PowerSGDOptions& options = {});
  ~PowerSGDHook() override;
  std::string describe() const override;
  CommFuture run(CommBucket& bucket) override;
  // Per bucket: Q of every compressed gradient and the error feedback.
  std::string save_state() const override;
  void load_state(const std::string& bytes) override;

  // Elements this rank sent in the last step's allreduces (P, Q and the
  // uncompressed rest), summed over the buckets; compare with the gradients'
  // numel for the compression.
  struct Stats {
    int64_t steps = 0;              // steps run compressed
    int64_t sent_elements = 0;      // in the last step
    int64_t gradient_elements = 0;  // in the last step
  };
  Stats stats() const;

 private:
  struct KOLO_HIDDEN Impl;
  std::shared_ptr<Impl> impl_;
};

std::shared_ptr<PowerSGDHook> powersgd_hook(const PowerSGDOptions& options = {});

}  // namespace kolo
#pragma GCC visibility pop
