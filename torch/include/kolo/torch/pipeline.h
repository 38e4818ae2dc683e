// Pipeline parallelism: a torch::nn::Sequential cut into stages, one stage
// per rank of a pipeline group, trained on micro-batches (GPipe, or 1F1B as
// in PipeDream-Flush).
//
//   auto model = torch::nn::Sequential(...);            // the same on every stage's rank
//   kolo::PipelineOptions options;
//   options.micro_batches = 8;
//   kolo::Pipeline pipe(model, options);                 // runs this rank's stage only
//   torch::optim::Adam adam(pipe.parameters(), 1e-3);    // this stage's parameters
//   for (...) {
//     adam.zero_grad();
//     auto loss = pipe.train_step(x, y, loss_fn);        // x used on stage 0, y on the last
//     adam.step();                                        // once per batch
//   }
//
// Stages. Module i of the Sequential goes to the stage whose range holds it:
// by hand (stage_sizes: modules per stage), balanced by parameter count
// (contiguous ranges minimising the largest stage's count), or balanced by
// measured time (each module's forward + backward timed on a sample
// micro-batch by the first stage's rank). The first stage's rank decides and
// sends the partition down the pipeline, with every module's parameter count:
// a rank whose model has other modules or counts fails with a ContractError,
// and so does every other stage (the verdict travels back up).
//
// A step. The batch is cut along dim 0 into micro_batches micro-batches as
// evenly as possible (the first B % m get one more row). A stage receives a
// micro-batch's activation from the previous stage, runs its modules, sends
// the result to the next stage; in backward it receives the gradient of its
// output, backpropagates, and sends the gradient of its input back. The last
// stage computes loss_fn(output, target) per micro-batch and scales it by
// b_k / B (b_k rows of B), so the gradients that accumulate in the stage's
// parameters over the m micro-batches are those of the mean loss over the
// whole batch, as in one process; train_step returns that loss on the last
// stage. With a data-parallel optimizer that divides by its
// backward_passes_per_step (DistributedOptimizer, ZeroOptimizer: set it to
// micro_batches), set optimizer_averages_micro_batches: the scale becomes
// m * b_k / B.
//
// Schedules. kGPipe: every forward, then every backward (a stage holds the
// activations of all m micro-batches at once). k1F1B: stage s runs
// min(p - s - 1, m) forwards, then alternates one forward and one backward,
// then the remaining backwards: it holds at most p - s micro-batches, so
// activation memory no longer grows with m. Both have the same bubble,
// (p - 1) / (m + p - 1) of the step for p stages.
//
// Transfers are kolo point-to-point transfers of tensors (kolo/torch/p2p.h) on
// options.communicator (default: the runtime's world): activations with tag
// `tag`, gradients with tag + 1, sends nonblocking, receives blocking. The
// stages are the ranks stage_ranks[0..p-1] of that communicator; a rank not
// in stage_ranks is a ContractError.
//
// Dropout and other randomness. With options.seed set, each stage seeds
// torch's generator with pipeline_seed(seed, step, micro_batch, stage) before
// each micro-batch's forward, so a run is reproducible and equals the unsplit
// model run micro-batch by micro-batch with the same seeds (the tests do
// exactly that). Ranks as threads share one generator: give their pipelines
// one rng_mutex, held from the seeding to the end of that forward.
#pragma once

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#pragma GCC visibility push(default)

namespace kolo {

class Communicator;

enum class PipelineSchedule { kGPipe, k1F1B };
// "gpipe", "1f1b"; ContractError listing them otherwise.
PipelineSchedule parse_pipeline_schedule(const std::string& name);
const char* pipeline_schedule_name(PipelineSchedule schedule);

enum class PipelineBalance {
  kManual,      // PipelineOptions::stage_sizes
  kParameters,  // equal parameter counts, as far as contiguous ranges allow
  kTime,        // equal measured forward + backward time (needs balance_sample)
};

struct PipelineOptions {
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int micro_batches = 4;
  PipelineBalance balance = PipelineBalance::kParameters;
  std::vector<int64_t> stage_sizes;  // kManual: modules per stage, summing to the model's
  torch::Tensor balance_sample;      // kTime: one micro-batch of inputs (stage 0's rank uses it)
  // The pipeline's ranks in stage order (ranks of `communicator`); empty =
  // every rank of the communicator, stage s on rank s.
  std::vector<int> stage_ranks;
  Communicator* communicator = nullptr;           // nullptr = kolo::runtime().world()
  int tag = 100;                                  // activations; tag + 1: gradients
  std::chrono::milliseconds timeout{0};           // per transfer; 0 = the communicator's default
  bool optimizer_averages_micro_batches = false;  // see "A step" above
  std::optional<uint64_t> seed;                   // see "Dropout" above
  std::mutex* rng_mutex = nullptr;
};

// Seed of micro-batch `micro_batch` of step `step` on stage `stage`.
uint64_t pipeline_seed(uint64_t seed, int64_t step, int micro_batch, int stage);

// Modules per stage of `model` for `stages` stages, balanced by parameter count.
std::vector<int64_t> balance_by_parameters(const torch::nn::Sequential& model, int stages);
// Balanced by the forward + backward time of each module on `sample` (median
// of `repeats` runs), measured on the calling thread.
std::vector<int64_t> balance_by_time(torch::nn::Sequential model, int stages,
                                     const torch::Tensor& sample, int repeats = 3);
// Contiguous ranges of `costs` (one per module) into `stages` non-empty parts
// minimising the largest part's sum; sizes of the parts.
std::vector<int64_t> balance_costs(const std::vector<double>& costs, int stages);

// loss_fn(output of the last stage for a micro-batch, its targets) -> the
// mean loss over the micro-batch (a scalar).
using PipelineLoss = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

class Pipeline {
 public:
  // Collective over the stages. Keeps the modules of this rank's stage in a
  // Sequential of its own (module()); the one handed in is not changed.
  Pipeline(torch::nn::Sequential model, const PipelineOptions& options = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  int stage() const;
  int stages() const;
  bool is_first() const { return stage() == 0; }
  bool is_last() const { return stage() == stages() - 1; }
  // Index of this stage's first module in the whole model, and the sizes.
  int64_t first_module() const;
  const std::vector<int64_t>& stage_sizes() const;
  // This stage's modules (named by their index in the whole model, so their
  // parameters keep the names they had: "3.weight").
  torch::nn::Sequential& module();
  std::vector<torch::Tensor> parameters() const;

  // One batch: every micro-batch forward and backward, by the schedule.
  // `inputs` is read on the first stage, `targets` on the last (others may
  // pass undefined tensors). Gradients accumulate into this stage's
  // parameters (zero them before, step after). Returns the batch's mean loss
  // on the last stage, an undefined tensor elsewhere.
  torch::Tensor train_step(const torch::Tensor& inputs, const torch::Tensor& targets,
                           const PipelineLoss& loss_fn);
  // Inference: every micro-batch forward without autograd; the last stage
  // returns the outputs concatenated in batch order, the others undefined.
  torch::Tensor forward(const torch::Tensor& inputs);

  // What the last train_step did on this stage.
  struct Stats {
    double step_seconds = 0;  // wall time of train_step
    double busy_seconds = 0;  // in this stage's forward and backward computations
    // Activation memory: per micro-batch, the bytes of the stage's input and
    // of every module's output (what autograd keeps for backward), held from
    // its forward until its backward. Peak over the step.
    int64_t peak_activation_bytes = 0;
    int max_live_micro_batches = 0;  // micro-batches between forward and backward at once
    // 1 - busy / step: the fraction of the step this stage waited.
    double idle_fraction() const {
      return step_seconds > 0 ? 1.0 - busy_seconds / step_seconds : 0.0;
    }
  };
  const Stats& stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolo

#pragma GCC visibility pop
