// kolo::Trainer: Keras' model.fit with Horovod's callbacks, in C++ (the
// seeds' workflow; docs/torch.md, "Trainer").
//
//   kolo::Trainer trainer(*model, forward, loss, *optimizer, options);
//   trainer.add(std::make_shared<kolo::BroadcastGlobalVariables>(0));
//   trainer.add(std::make_shared<kolo::MetricAverage>());
//   trainer.add(std::make_shared<kolo::LearningRateWarmup>(warmup));
//   trainer.add(std::make_shared<kolo::ProgressBar>());
//   trainer.fit(train, &test);
//
// Each epoch every rank takes its shard of the training set from a
// DistributedSampler (set_epoch(epoch): a new order per epoch, the same on
// every rank), steps the optimizer on batches of options.batch_size, and
// then, with a validation set, evaluates on its shard of it. Callbacks see
// the run at Keras' points (train, epoch and batch begin / end) with a Logs
// map of metrics ("loss", "accuracy", "val_loss", "val_accuracy", ...);
// they run in the order they were added, on every rank (a callback that
// prints checks trainer.rank() itself).
//
// A step of fit() is the hand-written Horovod loop, nothing more:
//   optimizer.zero_grad(); loss(forward(inputs), targets).backward(); optimizer.step();
// so a Trainer run equals that loop with the same sampler and rates
// (tests/torch/trainer_test.cc checks it to the last bit of float32).
//
// Elastic: with options.elastic (a kolo::elastic::TrainerState,
// kolo/torch/elastic.h) fit() is the body of kolo::elastic::run: the same
// loop, started from the state's position and committing it every
// commit_every batches (docs/elastic.md, "Elastic fit").
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/core/batch_balancer.h"
#include "kolo/torch/checkpoint.h"
#include "kolo/torch/lr.h"
#include "kolo/torch/mixed_precision.h"
#include "kolo/torch/sampler.h"
#include "kolo/torch/tensor.h"

namespace torch::nn {
class Module;
}
namespace kolo::elastic {
class TrainerState;
}

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

class ParallelOptimizer;
class Trainer;

// Metrics by name, as Keras' logs dict.
using Logs = std::map<std::string, double>;

// A data set: `size` samples; get(indices) returns the inputs and targets of
// those rows (indices: int64 (B)).
struct Dataset {
  int64_t size = 0;
  std::function<std::pair<torch::Tensor, torch::Tensor>(const torch::Tensor& indices)> get;
};

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_begin(Trainer& trainer) {}
  virtual void on_epoch_begin(Trainer& trainer, int64_t epoch) {}
  virtual void on_batch_begin(Trainer& trainer, int64_t step) {}
  virtual void on_batch_end(Trainer& trainer, int64_t step, Logs& logs) {}
  virtual void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) {}
  virtual void on_train_end(Trainer& trainer, Logs& logs) {}

  // Elastic fit (TrainerOptions::elastic). When fit() continues from a
  // commit (after a re-formation, in a newcomer, or from a commit file)
  // on_reset runs instead of on_train_begin, in the new world, after the
  // state was restored and synced from rank 0 and every callback's
  // load_state() ran: set up again what depends on the world (its size, the
  // steps per epoch), not what the commit restored.
  virtual void on_reset(Trainer& trainer) {}
  // What of the callback a commit holds, and its restore (the same keys;
  // the trainer keeps each callback's keys apart). Default: nothing.
  using State = std::map<std::string, std::string>;
  virtual State save_state() const { return {}; }
  virtual void load_state(const State& state) {}
};

// CallOptions: the engine, process set and timeout of the trainer's own
// collectives (metric averages, evaluation, the balancer, callbacks'); give
// the optimizer's (0 = no limit of its own, as everywhere in kolo).
struct TrainerOptions : CallOptions {
  int64_t epochs = 1;
  int64_t initial_epoch = 0;      // epochs already done (a resumed run)
  int64_t batch_size = 32;        // per rank; the global batch is batch_size x ranks
  int64_t eval_batch_size = 100;  // per rank
  // shuffle, seed, drop_last of the training sampler; its rank and
  // world_size are ignored: the optimizer's rank and world size. Evaluation
  // takes every sample once, in order.
  DistributedSamplerOptions sampling;
  bool autocast_bf16 = false;  // the forward pass under AutocastGuard(kBFloat16) of `device`
  // Where the model is (the caller moves it there): each batch's inputs and
  // targets are moved to it before the forward pass. CUDA tensors go through
  // the optimizer's collectives as they are (kolo/core/device.h).
  torch::Device device = torch::kCPU;
  // Dynamic loss scaling (Keras' LossScaleOptimizer, PyTorch's GradScaler;
  // mixed_precision.h), or nullptr: each step backpropagates
  // loss_scaler->scale(loss) and steps through loss_scaler->step(optimizer),
  // which skips the step on every rank when any rank's gradients overflowed.
  // ModelCheckpoint saves and restores its scale. Must outlive the trainer.
  LossScaler* loss_scaler = nullptr;
  // Split each step's global batch by the ranks' measured compute speed
  // (kolo::BatchBalancer over these CallOptions) instead of evenly: step k's
  // global batch is positions [k G, (k + 1) G) of the epoch's one shuffled
  // order of the whole set (the last partial global batch is left out), this
  // rank takes balancer().batch() of them at balancer().offset(), and scales
  // its mean loss by balancer().gradient_weight() before backward().
  bool balance = false;
  // Elastic training (kolo/torch/elastic.h, docs/elastic.md): fit() trains
  // from this state's position and commits it; call fit() inside
  // kolo::elastic::run(*elastic, ...). Not with balance, nor with a ZeRO
  // optimizer (a commit holds the whole optimizer state on every rank).
  elastic::TrainerState* elastic = nullptr;
};

// The steps Trainer::fit takes per epoch over `samples` on each of
// `world_size` ranks with these options: ceil(a rank's shard / batch_size)
// (the shard ceil(samples / world_size), or floor with sampling.drop_last),
// or with options.balance floor(samples / global batch). For a process that
// needs it without a Trainer (a parameter server saving once per epoch).
int64_t steps_per_epoch(int64_t samples, int world_size, const TrainerOptions& options);

class Trainer {
 public:
  using Forward = std::function<torch::Tensor(const torch::Tensor& inputs)>;
  // A mean over the batch (the averaged gradient is then the global batch's mean).
  using Loss =
      std::function<torch::Tensor(const torch::Tensor& outputs, const torch::Tensor& targets)>;

  // `model`, `optimizer` (from make_parallel_optimizer) must outlive the trainer.
  Trainer(torch::nn::Module& model, Forward forward, Loss loss, ParallelOptimizer& optimizer,
          TrainerOptions options = {});
  void add(std::shared_ptr<Callback> callback);

  // Collective. Trains options.epochs - initial_epoch epochs (fewer when a
  // callback sets stop_training); returns the last epoch's logs: "loss" and
  // "accuracy" (this rank's mean over its batches; MetricAverage averages
  // them over the ranks), "val_loss" and "val_accuracy" with a validation set.
  // With options.elastic: from the state's epoch and batch, and "loss" and
  // "accuracy" are the whole world's over the whole epoch (every round of it).
  Logs fit(const Dataset& train, const Dataset* validation = nullptr);
  // Collective. "loss" and "accuracy" (argmax of the outputs against integer
  // targets) over this rank's shard of `data`, averaged over the ranks; the
  // model in eval mode meanwhile (dropout off), in its previous mode after.
  Logs evaluate(const Dataset& data);

  // Keras' train_on_batch, for training loops of one's own: one step of fit() on (inputs, targets)
  // — zero_grad(), forward and loss (under options.autocast_bf16), backward() (of the loss scaled
  // by options.loss_scaler), step(). Collective like every step; no callbacks run. Returns the
  // batch's "loss" and, for class scores (B, C) against integer targets (B), its "accuracy".
  Logs train_on_batch(const torch::Tensor& inputs, const torch::Tensor& targets);

  torch::nn::Module& model() { return model_; }
  ParallelOptimizer& optimizer() { return optimizer_; }
  const TrainerOptions& options() const { return options_; }
  int64_t epoch() const { return epoch_; }  // 0-based, during fit
  // Of this fit; elastic: of the current epoch as this world trains it (the
  // batches done before plus this world's share of the rest).
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // The steps fit() takes per epoch over a set of `samples` (for a rate
  // schedule built before fit): ceil(this rank's shard / batch_size), or with
  // options.balance floor(samples / global batch).
  int64_t steps_for(int64_t samples) const;
  int64_t samples_seen() const { return seen_; }  // this rank, this epoch (elastic: this round)
  // Seconds the epoch's training steps took (not its evaluation), set before
  // on_epoch_end; elastic: since the epoch's first batch, in whichever world.
  double epoch_seconds() const { return epoch_seconds_; }
  // With options.balance, during fit(); else nullptr.
  const BatchBalancer* balancer() const { return balancer_.get(); }
  int rank() const;
  int world_size() const;
  // Where fit() starts: set by a callback's on_train_begin (ModelCheckpoint's resume).
  void set_initial_epoch(int64_t epoch) { options_.initial_epoch = epoch; }
  // Set by a callback: in on_batch_end, fit() ends after that batch (an
  // epoch cut short gets no evaluation nor on_epoch_end; elastic: after the
  // batch's commit, if it had one); anywhere else, after the epoch.
  bool stop_training = false;

 private:
  torch::nn::Module& model_;
  Forward forward_;
  Loss loss_;
  ParallelOptimizer& optimizer_;
  TrainerOptions options_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  // The step of fit() and train_on_batch(): (outputs, loss).
  // Elastic: on_train_begin or load_state + on_reset, scale_lr, the first commit.
  void begin_elastic(elastic::TrainerState& state);
  // Elastic: adds this rank's metric sums since the last commit to the
  // world's totals (one allreduce), then commits.
  void commit_elastic(elastic::TrainerState& state, double (&uncommitted)[3]);
  void check_elastic(const elastic::TrainerState& state, const Dataset& train) const;
  static std::string callback_prefix(size_t i);
  friend class elastic::TrainerState;
  std::pair<torch::Tensor, torch::Tensor> step_on(const torch::Tensor& inputs,
                                                  const torch::Tensor& targets,
                                                  BatchBalancer* balancer, double step_start);

  int64_t epoch_ = 0;
  int64_t steps_per_epoch_ = 0;
  int64_t seen_ = 0;
  double epoch_seconds_ = 0;
  std::unique_ptr<BatchBalancer> balancer_;
};

// --- Callbacks (Keras' and Horovod's names) ------------------------------

// hvd.callbacks.BroadcastGlobalVariablesCallback: at the start of training,
// every rank takes `root`'s parameters (and, at zero_stage 0, the optimizer
// state). At ZeRO stage 3 the parameters are sharded: broadcast before
// building the optimizer (ContractError says so).
class BroadcastGlobalVariables : public Callback {
 public:
  explicit BroadcastGlobalVariables(int root = 0) : root_(root) {}
  void on_train_begin(Trainer& trainer) override;

 private:
  int root_;
};

// hvd.callbacks.MetricAverageCallback: at the end of each epoch every metric
// in the logs is replaced by its mean over the ranks (metric_average, in the
// logs' key order, the same on every rank). Add it before the callbacks that
// read metrics.
class MetricAverage : public Callback {
 public:
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;
};

// hvd.callbacks.LearningRateWarmupCallback (Goyal et al.): the rate of every
// parameter group follows LrSchedule(options) per step (steps_per_epoch is
// the trainer's); logs["lr"] holds the epoch's last rate. The second form
// derives the options from the trainer at train begin and, in an elastic
// fit, again in every new world (on_reset): a rate scaled by its size.
class LearningRateWarmup : public Callback {
 public:
  explicit LearningRateWarmup(LrScheduleOptions options)
      : make_options_([options](const Trainer&) { return options; }) {}
  explicit LearningRateWarmup(std::function<LrScheduleOptions(const Trainer&)> make_options)
      : make_options_(std::move(make_options)) {}
  void on_train_begin(Trainer& trainer) override;
  void on_reset(Trainer& trainer) override { on_train_begin(trainer); }
  void on_batch_begin(Trainer& trainer, int64_t step) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;

 private:
  std::function<LrScheduleOptions(const Trainer&)> make_options_;
  std::unique_ptr<LrSchedule> schedule_;
  double lr_ = 0;
};

// keras.callbacks.LearningRateScheduler: the rate at each epoch's start is
// schedule(epoch, current rate).
class LearningRateSchedule : public Callback {
 public:
  explicit LearningRateSchedule(std::function<double(int64_t epoch, double lr)> schedule)
      : schedule_(std::move(schedule)) {}
  void on_epoch_begin(Trainer& trainer, int64_t epoch) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;
  // The last epoch it applied `schedule` to: an elastic fit resumed in the
  // middle of that epoch (whose committed rate it already is) does not
  // apply it again.
  State save_state() const override { return {{"applied", std::to_string(applied_)}}; }
  void load_state(const State& state) override;

 private:
  std::function<double(int64_t, double)> schedule_;
  int64_t applied_ = -1;
};

// The seed's throughput lines: logs["epoch_time"] (s, the epoch's training
// steps: Trainer::epoch_seconds()), logs["images"] (every rank's training
// samples of the epoch) and logs["images_per_sec"] (images / epoch_time);
// with `print`, rank 0 prints
//   Epoch time: 27.1 s
//   Images/sec: 2250.3 (2 worker(s), 1125.2 per worker)
// Collective (one metric_average).
class Throughput : public Callback {
 public:
  explicit Throughput(bool print = true) : print_(print) {}
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;

 private:
  bool print_;
};

// keras.callbacks.ModelCheckpoint (and BackupAndRestore) for a
// ParallelOptimizer: after every epoch, save_checkpoint(dir, optimizer,
// {epoch + 1, seed, sampler position, the loss scaler's extras}): collective; at zero_stage 0 rank
// 0 writes, at stages 1-3 every rank its shard, and the index is written last after every shard, so
// the directory holds the new checkpoint or the previous one, never a mix (docs/zero.md, "Sharded
// checkpoints").
struct ModelCheckpointOptions {
  std::string dir;
  // On train begin, load the checkpoint in `dir` (any stage and world size
  // wrote it) and continue after its epoch: kRequired fails (ContractError
  // naming the file) when there is none, kIfPresent then starts afresh.
  enum class Resume { kNo, kIfPresent, kRequired } resume = Resume::kNo;
  bool verbose = false;  // rank 0 prints "Resumed from <dir> after epoch N" and "Saved <dir>"
};
class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {}
  void on_train_begin(Trainer& trainer) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;

 private:
  ModelCheckpointOptions options_;
};

// keras.callbacks.EarlyStopping: stops when `monitor` has not improved by
// more than min_delta for more than `patience` epochs. mode "min" (losses) or
// "max" (accuracies). The value is averaged over the ranks first (collective),
// so every rank takes the same decision even when their logs differ.
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(std::string monitor = "val_loss", int patience = 0, double min_delta = 0,
                         std::string mode = "min");
  void on_train_begin(Trainer& trainer) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;
  State save_state() const override;  // best, wait (an elastic fit commits them)
  void load_state(const State& state) override;
  int64_t stopped_epoch() const { return stopped_epoch_; }  // -1 = did not stop

 private:
  std::string monitor_, mode_;
  int patience_;
  double min_delta_;
  double best_ = 0;
  int wait_ = 0;
  bool have_best_ = false;
  int64_t stopped_epoch_ = -1;
};

// Keras' progress bar on rank 0: "Epoch 2/5", then every steps / `lines`
// steps a line with this rank's running means
//   235/469 [==============>...............] - ETA: 12s - 52ms/step - loss: 0.4000 - accuracy:
//   0.8000
// and at the epoch's end the last line with the training time and the
// epoch's logs (averaged over the ranks when MetricAverage was added before)
//   469/469 [==============================] - 24s 52ms/step - loss: 0.3900 - accuracy: 0.8100
class ProgressBar : public Callback {
 public:
  explicit ProgressBar(int lines = 10) : lines_(lines) {}
  void on_epoch_begin(Trainer& trainer, int64_t epoch) override;
  void on_batch_end(Trainer& trainer, int64_t step, Logs& logs) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;

 private:
  // One line as above (`done`: the epoch's last).
  static void print(int64_t step, int64_t steps, double elapsed_s, const Logs& logs, bool done);
  int lines_;
  double start_ = 0;
};

// keras.callbacks.CSVLogger on rank 0: one row per epoch ("epoch" and the
// logs' keys, sorted), the header first; the file is rewritten whole after
// each epoch (written to a temporary file and renamed). A path that exists
// and is not a regular file (/dev/stdout, /dev/null, a FIFO) gets the header
// and then one row per epoch, written in place. Its rows are part of an
// elastic commit: an epoch trained again after a fault has one row.
class CsvLogger : public Callback {
 public:
  explicit CsvLogger(std::string path) : path_(std::move(path)) {}
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;
  State save_state() const override;
  void load_state(const State& state) override;

 private:
  std::string path_;
  std::vector<std::string> columns_;
  std::vector<std::string> rows_;
};

}  // namespace kolo
#pragma GCC visibility pop
