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
// STATUS: work in progress on branch `precision`, not on main. trainer.cc
// compiles (checked alone with the library's flags); tests/torch/trainer_test.cc
// has not been built or run; examples/fashion_mnist is not rewritten on it.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kolo/torch/checkpoint.h"
#include "kolo/torch/lr.h"
#include "kolo/torch/sampler.h"
#include "kolo/torch/tensor.h"

namespace torch::nn {
class Module;
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
};

// CallOptions: the optimizer's engine, process set and timeout (for the
// metric averages and evaluation).
struct TrainerOptions : CallOptions {
  int64_t epochs = 1;
  int64_t initial_epoch = 0;      // epochs already done (a resumed run)
  int64_t batch_size = 32;        // per rank
  int64_t eval_batch_size = 100;  // per rank
  // shuffle, seed, drop_last of the training sampler (rank and size: the
  // optimizer's process set). Evaluation takes every sample once, in order.
  DistributedSamplerOptions sampling;
  bool autocast_bf16 = false;  // the forward pass under AutocastGuard(kBFloat16)
};

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
  Logs fit(const Dataset& train, const Dataset* validation = nullptr);
  // Collective. "loss" and "accuracy" (argmax of the outputs against integer
  // targets) over this rank's shard of `data`, averaged over the ranks.
  Logs evaluate(const Dataset& data);

  torch::nn::Module& model() { return model_; }
  ParallelOptimizer& optimizer() { return optimizer_; }
  const TrainerOptions& options() const { return options_; }
  int64_t epoch() const { return epoch_; }                      // 0-based, during fit
  int64_t steps_per_epoch() const { return steps_per_epoch_; }  // of this fit
  int64_t samples_seen() const { return seen_; }                // this rank, this epoch
  int rank() const;
  int world_size() const;
  // Where fit() starts: set by a callback's on_train_begin (ModelCheckpoint's resume).
  void set_initial_epoch(int64_t epoch) { options_.initial_epoch = epoch; }
  bool stop_training = false;  // set by a callback: fit() ends after this epoch

 private:
  torch::nn::Module& model_;
  Forward forward_;
  Loss loss_;
  ParallelOptimizer& optimizer_;
  TrainerOptions options_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  int64_t epoch_ = 0;
  int64_t steps_per_epoch_ = 0;
  int64_t seen_ = 0;
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
// the trainer's); logs["lr"] holds the epoch's last rate.
class LearningRateWarmup : public Callback {
 public:
  explicit LearningRateWarmup(LrScheduleOptions options) : options_(options) {}
  void on_train_begin(Trainer& trainer) override;
  void on_batch_begin(Trainer& trainer, int64_t step) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;

 private:
  LrScheduleOptions options_;
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

 private:
  std::function<double(int64_t, double)> schedule_;
};

// The seed's throughput lines: logs["epoch_time"] (s) and
// logs["images_per_sec"] (every rank's samples / epoch time), and on rank 0
//   Epoch time: 27.1 s
//   Images/sec: 2250.3 (2 worker(s), 1125.2 per worker)
class Throughput : public Callback {
 public:
  explicit Throughput(bool print = true) : print_(print) {}
  void on_epoch_begin(Trainer& trainer, int64_t epoch) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;

 private:
  bool print_;
  double start_ = 0;
};

// keras.callbacks.ModelCheckpoint for ParallelOptimizer: after every epoch,
// save_checkpoint(dir, optimizer, {epoch + 1}) (collective; rank 0 writes the
// index last, so the directory is complete or the previous one). With
// `resume`, on_train_begin loads `dir` when it holds a checkpoint and fit()
// continues after its epoch.
class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(std::string dir, bool resume = false)
      : dir_(std::move(dir)), resume_(resume) {}
  void on_train_begin(Trainer& trainer) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;

 private:
  std::string dir_;
  bool resume_;
};

// keras.callbacks.EarlyStopping: stops when `monitor` (averaged over the
// ranks, so every rank decides alike) has not improved by min_delta for
// `patience` epochs. mode "min" (losses) or "max" (accuracies).
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(std::string monitor = "val_loss", int patience = 0, double min_delta = 0,
                         std::string mode = "min");
  void on_train_begin(Trainer& trainer) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;
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

// Keras' progress bar on rank 0: "Epoch 2/5", then `lines` lines per epoch
//   235/469 [==============>...............] - ETA: 12s - 52ms/step - loss: 0.4 - accuracy: 0.8
// and the epoch's last line with its total time.
class ProgressBar : public Callback {
 public:
  explicit ProgressBar(int lines = 10) : lines_(lines) {}
  void on_epoch_begin(Trainer& trainer, int64_t epoch) override;
  void on_batch_end(Trainer& trainer, int64_t step, Logs& logs) override;
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;

 private:
  int lines_;
  double start_ = 0;
};

// keras.callbacks.CSVLogger on rank 0: one row per epoch ("epoch" and the
// logs' keys, sorted), the header first; the file is rewritten whole after
// each epoch (written to a temporary file and renamed).
class CsvLogger : public Callback {
 public:
  explicit CsvLogger(std::string path) : path_(std::move(path)) {}
  void on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) override;

 private:
  std::string path_;
  std::vector<std::string> columns_;
  std::vector<std::string> rows_;
};

}  // namespace kolo
#pragma GCC visibility pop
