// kolo::Trainer and its callbacks (kolo/torch/trainer.h).
#include "kolo/torch/trainer.h"

#include <fcntl.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "kolo/core/errors.h"
#include "kolo/torch/broadcast.h"
#include "kolo/torch/elastic.h"
#include "kolo/torch/metrics.h"
#include "kolo/torch/parallel_optimizer.h"
#include "kolo/torch/ps_optimizer.h"

namespace kolo {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Wall-clock seconds: an elastic epoch's start is committed and read in
// other processes.
double wall_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

torch::Tensor rows_of(const std::vector<size_t>& indices, size_t begin, size_t end) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(end - begin)}, torch::kLong);
  auto* out = t.data_ptr<int64_t>();
  for (size_t i = begin; i < end; ++i) out[i - begin] = static_cast<int64_t>(indices[i]);
  return t;
}

// Correct predictions in a batch, or -1 when the outputs are not class scores
// (B, C) against integer targets (B).
int64_t correct_of(const torch::Tensor& outputs, const torch::Tensor& targets) {
  if (outputs.dim() != 2 || targets.dim() != 1 ||
      !c10::isIntegralType(targets.scalar_type(), false)) {
    return -1;
  }
  return outputs.argmax(1).eq(targets).sum().item<int64_t>();
}

void check_dataset(const Dataset& data, const char* which) {
  if (data.size <= 0 || !data.get) {
    throw ContractError(std::string("kolo::Trainer: the ") + which + " set has size " +
                        std::to_string(data.size) + (data.get ? "" : " and no get function") +
                        "; give a Dataset with size > 0 and get(indices)");
  }
}

}  // namespace

// The keys of callback i's save_state() in an elastic commit.
std::string Trainer::callback_prefix(size_t i) { return "callback" + std::to_string(i) + "/"; }

Trainer::Trainer(torch::nn::Module& model, Forward forward, Loss loss, ParallelOptimizer& optimizer,
                 TrainerOptions options)
    : model_(model),
      forward_(std::move(forward)),
      loss_(std::move(loss)),
      optimizer_(optimizer),
      options_(std::move(options)) {
  if (!forward_ || !loss_) {
    throw ContractError("kolo::Trainer: give both a forward and a loss function");
  }
  if (options_.batch_size < 1 || options_.eval_batch_size < 1) {
    throw ContractError("kolo::Trainer: options.batch_size and eval_batch_size must be >= 1");
  }
  if (options_.epochs < 0 || options_.initial_epoch < 0) {
    throw ContractError("kolo::Trainer: options.epochs and initial_epoch must be >= 0");
  }
}

int Trainer::rank() const { return optimizer_.rank(); }

int64_t steps_per_epoch(int64_t samples, int world_size, const TrainerOptions& options) {
  // Public: a parameter server calls it with numbers of its own (a zero
  // would divide by zero below).
  if (samples < 0 || world_size < 1 || options.batch_size < 1) {
    throw ContractError(
        "kolo::steps_per_epoch: needs samples >= 0, world_size >= 1 and "
        "options.batch_size >= 1; got " +
        std::to_string(samples) + ", " + std::to_string(world_size) + " and " +
        std::to_string(options.batch_size));
  }
  const int64_t world = world_size;
  const int64_t batch = options.batch_size;
  if (options.balance) return samples / (batch * world);
  // The sampler's shard: ceil(samples / world), or floor with drop_last.
  const int64_t shard =
      options.sampling.drop_last ? samples / world : (samples + world - 1) / world;
  return (shard + batch - 1) / batch;
}

int64_t Trainer::steps_for(int64_t samples) const {
  return kolo::steps_per_epoch(samples, world_size(), options_);
}
int Trainer::world_size() const { return optimizer_.world_size(); }

void Trainer::add(std::shared_ptr<Callback> callback) {
  if (!callback) throw ContractError("kolo::Trainer::add: the callback is null");
  callbacks_.push_back(std::move(callback));
}

Logs Trainer::fit(const Dataset& train, const Dataset* validation) {
  check_dataset(train, "training");
  if (validation) check_dataset(*validation, "validation");
  elastic::TrainerState* const state = options_.elastic;
  if (state) check_elastic(*state, train);
  const auto batch = static_cast<size_t>(options_.batch_size);
  const auto global_batch = batch * static_cast<size_t>(world_size());
  DistributedSamplerOptions sampling = options_.sampling;
  // --balance: one order of the whole set, the same on every rank (a
  // sampler of one rank); the balancer says which part of each global batch
  // is this rank's. Elastic: the state's sampler, for the world and the
  // samples of the epoch not yet taken.
  sampling.rank = options_.balance ? 0 : rank();
  sampling.world_size = options_.balance ? 1 : world_size();
  std::unique_ptr<DistributedSampler> own_sampler;
  if (!state)
    own_sampler = std::make_unique<DistributedSampler>(static_cast<size_t>(train.size), sampling);
  steps_per_epoch_ = steps_for(train.size);
  if (options_.balance) {
    if (steps_per_epoch_ == 0) {
      throw ContractError("kolo::Trainer: options.balance needs at least one global batch of " +
                          std::to_string(global_batch) + " samples per epoch, the set has " +
                          std::to_string(train.size) +
                          "; give more samples or a smaller batch_size");
    }
    BatchBalancerOptions balance;
    static_cast<CallOptions&>(balance) = options_;
    balance.global_batch = static_cast<int64_t>(global_batch);
    balance.name = "trainer/balancer";
    balancer_ = std::make_unique<BatchBalancer>(balance);
  } else {
    balancer_.reset();
  }
  stop_training = false;
  // The state refers to this trainer while it trains this round (its
  // callbacks' state goes into the commits), and not after.
  struct Attach {
    elastic::TrainerState* state;
    ~Attach() {
      if (state) state->trainer_ = nullptr;
    }
  } attach{state};
  if (state) {
    state->trainer_ = this;
    begin_elastic(*state);
  } else {
    for (auto& c : callbacks_) c->on_train_begin(*this);
  }
  Logs logs;
  epoch_ = state ? state->epoch : options_.initial_epoch;
  while (epoch_ < options_.epochs && !stop_training) {
    DistributedSampler& sampler = state ? state->sampler() : *own_sampler;
    if (!state) sampler.set_epoch(epoch_);
    // Elastic: the batches done in earlier worlds count in the epoch's steps.
    const int64_t first_step = state ? state->batch : 0;
    if (state) {
      const int64_t left = static_cast<int64_t>(sampler.size()) - sampler.position().next_index;
      steps_per_epoch_ = first_step + (left + options_.batch_size - 1) / options_.batch_size;
    }
    model_.train();
    for (auto& c : callbacks_) c->on_epoch_begin(*this, epoch_);
    const std::vector<size_t>& indices = sampler.indices();
    double loss_sum = 0;
    int64_t correct = 0;
    bool scored = true;
    double uncommitted[3] = {0, 0, 0};  // elastic: loss sum, correct, samples since the last commit
    bool committed = false;             // elastic: the last batch was committed
    seen_ = 0;
    const double epoch_start = now_s();
    if (state && state->totals_.started == 0) state->totals_.started = wall_s();
    bool cut_short = false;
    for (int64_t step = first_step; step < steps_per_epoch_; ++step) {
      for (auto& c : callbacks_) c->on_batch_begin(*this, step);
      const double step_start = now_s();
      torch::Tensor rows;
      if (balancer_) {
        const size_t begin =
            static_cast<size_t>(step) * global_batch + static_cast<size_t>(balancer_->offset());
        rows = rows_of(indices, begin,
                       std::min(indices.size(), begin + static_cast<size_t>(balancer_->batch())));
      } else {
        const auto next = sampler.next(batch);
        if (!next) break;  // the shard is exhausted (not before the last step)
        rows = rows_of(*next, 0, next->size());
      }
      const auto [host_inputs, host_targets] = train.get(rows);
      const torch::Tensor inputs = host_inputs.to(options_.device);
      const torch::Tensor targets = host_targets.to(options_.device);
      const auto [outputs, loss] = step_on(inputs, targets, balancer_.get(), step_start);
      const int64_t b = rows.size(0);
      const double batch_loss = loss.item<double>() * static_cast<double>(b);
      loss_sum += batch_loss;
      seen_ += b;
      const int64_t c = scored ? correct_of(outputs, targets) : -1;
      if (c < 0) scored = false;
      correct += std::max<int64_t>(c, 0);
      Logs batch_logs{{"loss", loss_sum / static_cast<double>(seen_)}};
      if (scored)
        batch_logs["accuracy"] = static_cast<double>(correct) / static_cast<double>(seen_);
      if (state) {
        uncommitted[0] += batch_loss;
        uncommitted[1] += static_cast<double>(std::max<int64_t>(c, 0));
        uncommitted[2] += static_cast<double>(b);
        ++state->batch;  // the batches done, as on_batch_end sees them
      }
      const bool stopping = stop_training;
      for (auto& cb : callbacks_) cb->on_batch_end(*this, step, batch_logs);
      // After on_batch_end, so that the commit holds what the callbacks did.
      // A dead peer makes a step or the commit throw; elastic::run takes it from there.
      committed = state && state->batch % state->options_.commit_every == 0;
      if (committed) commit_elastic(*state, uncommitted);
      if (!stopping && stop_training && step + 1 < steps_per_epoch_) {
        cut_short = true;
        break;
      }
    }
    if (cut_short) break;
    if (state) {
      // The end of an epoch is always a commit (unless its last batch was
      // one); the epoch's metrics are then the world's over every round of it.
      if (!committed) commit_elastic(*state, uncommitted);
      const elastic::TrainerState::EpochTotals& totals = state->totals_;
      epoch_seconds_ = std::max(wall_s() - totals.started, 1e-9);
      const double samples = std::max(totals.samples, 1.0);
      logs = {{"loss", totals.loss_sum / samples}};
      if (scored) logs["accuracy"] = totals.correct / samples;
    } else {
      epoch_seconds_ = now_s() - epoch_start;
      const double seen = static_cast<double>(std::max<int64_t>(seen_, 1));
      logs = {{"loss", loss_sum / seen}};
      if (scored) logs["accuracy"] = static_cast<double>(correct) / seen;
    }
    if (validation) {
      for (const auto& [name, value] : evaluate(*validation)) logs["val_" + name] = value;
    }
    for (auto& c : callbacks_) c->on_epoch_end(*this, epoch_, logs);
    ++epoch_;
    if (state) {
      // The next epoch starts from a commit with fresh totals.
      state->epoch = epoch_;
      state->batch = 0;
      state->totals_ = {};
      commit_elastic(*state, uncommitted);
    }
  }
  for (auto& c : callbacks_) c->on_train_end(*this, logs);
  return logs;
}

void Trainer::check_elastic(const elastic::TrainerState& state, const Dataset& train) const {
  const auto& o = state.options_;
  const DistributedSamplerOptions& mine = options_.sampling;
  if (options_.balance) {
    throw ContractError(
        "kolo::Trainer: options.balance and options.elastic do not combine (the balancer "
        "splits one shuffled order of a fixed world); drop one of them");
  }
  if (optimizer_.zero_stage() != 0) {
    throw ContractError(
        "kolo::Trainer: options.elastic needs a DistributedOptimizer (zero_stage "
        "0), not ZeRO stage " +
        std::to_string(optimizer_.zero_stage()) +
        ": an elastic commit holds the whole optimizer state on every rank");
  }
  if (&optimizer_.optimizer() != &state.optimizer_) {
    throw ContractError(
        "kolo::Trainer: the optimizer wraps another torch optimizer than the one the "
        "elastic::TrainerState holds; build the state and the round's optimizer over the same one");
  }
  if (o.commit_every < 1) {
    throw ContractError("kolo::elastic::TrainerState: options.commit_every must be >= 1, not " +
                        std::to_string(o.commit_every));
  }
  if (static_cast<int64_t>(state.dataset_size()) != train.size) {
    throw ContractError("kolo::Trainer: the elastic::TrainerState was built for " +
                        std::to_string(state.dataset_size()) +
                        " training samples, the training set has " + std::to_string(train.size));
  }
  if (mine.shuffle != o.sampling.shuffle || mine.seed != o.sampling.seed ||
      mine.drop_last != o.sampling.drop_last) {
    throw ContractError(
        "kolo::Trainer: options.sampling (shuffle, seed, drop_last) differs from the "
        "elastic::TrainerState's options.sampling; give both the same");
  }
}

void Trainer::begin_elastic(elastic::TrainerState& state) {
  // Continuing from a commit (a re-formation, a newcomer, a commit file):
  // the callbacks get their committed state back, then set up for this world.
  // (committed_world_ is 0 in a commit or sync made before any trainer began.)
  const bool resumed = state.committed_world_ > 0;
  if (resumed) {
    if (state.restored_) {
      if (options_.loss_scaler) options_.loss_scaler->restore(state.extras_);
      for (size_t i = 0; i < callbacks_.size(); ++i) {
        const std::string prefix = callback_prefix(i);
        Callback::State mine;
        for (const auto& [key, value] : state.extras_) {
          if (key.rfind(prefix, 0) == 0) mine[key.substr(prefix.size())] = value;
        }
        callbacks_[i]->load_state(mine);
      }
      state.restored_ = false;
    }
    if (state.options_.scale_lr && state.committed_world_ > 0 &&
        state.committed_world_ != world_size()) {
      torch::optim::Optimizer& optimizer = optimizer_.optimizer();
      apply_lr(optimizer, current_lr(optimizer) * world_size() / state.committed_world_);
    }
    for (auto& c : callbacks_) c->on_reset(*this);
  } else {
    state.restored_ = false;
    for (auto& c : callbacks_) c->on_train_begin(*this);
    // Where training starts (a callback's resume may have moved it), then
    // the first commit: a fault before the next one returns here.
    state.epoch = options_.initial_epoch;
    state.batch = 0;
    state.totals_ = {};
  }
  state.committed_world_ = world_size();
  if (!resumed) state.commit();
}

void Trainer::commit_elastic(elastic::TrainerState& state, double (&uncommitted)[3]) {
  TensorOpOptions sum;
  static_cast<CallOptions&>(sum) = options_;
  sum.op = ReduceOp::kSum;
  const torch::Tensor sums =
      allreduce(torch::tensor({uncommitted[0], uncommitted[1], uncommitted[2]}, torch::kDouble),
                "trainer/epoch_totals", sum);
  const auto* s = sums.data_ptr<double>();
  state.totals_.loss_sum += s[0];
  state.totals_.correct += s[1];
  state.totals_.samples += s[2];
  std::fill(std::begin(uncommitted), std::end(uncommitted), 0.0);
  state.commit();
}

std::pair<torch::Tensor, torch::Tensor> Trainer::step_on(const torch::Tensor& inputs,
                                                         const torch::Tensor& targets,
                                                         BatchBalancer* balancer,
                                                         double step_start) {
  optimizer_.zero_grad();
  torch::Tensor outputs, loss;
  {
    AutocastGuard autocast(torch::kBFloat16, options_.autocast_bf16, options_.device.type());
    outputs = forward_(inputs);
    loss = loss_(outputs, targets);
  }
  // With the balancer, the mean over the global batch: this rank's share of
  // it weighs its mean loss.
  torch::Tensor objective = balancer ? loss * balancer->gradient_weight() : loss;
  if (options_.loss_scaler) objective = options_.loss_scaler->scale(objective);
  objective.backward();  // the buckets' exchange starts as their gradients are ready
  // The balancer times this rank's compute, not the wait in step().
  if (balancer) balancer->record(now_s() - step_start);
  // Waits for the exchanged gradients, then steps (the scaler: unscaled, or
  // skipped on every rank when one overflowed).
  if (options_.loss_scaler) {
    options_.loss_scaler->step(optimizer_);
  } else {
    optimizer_.step();
  }
  return {outputs, loss};
}

Logs Trainer::train_on_batch(const torch::Tensor& inputs, const torch::Tensor& targets) {
  model_.train();
  const auto [outputs, loss] = step_on(inputs, targets, nullptr, now_s());
  Logs logs{{"loss", loss.item<double>()}};
  const int64_t correct = correct_of(outputs, targets);
  if (correct >= 0) {
    logs["accuracy"] = static_cast<double>(correct) / static_cast<double>(targets.size(0));
  }
  return logs;
}

Logs Trainer::evaluate(const Dataset& data) {
  check_dataset(data, "evaluation");
  DistributedSamplerOptions shard;
  shard.shuffle = false;
  shard.rank = rank();
  shard.world_size = world_size();
  DistributedSampler sampler(static_cast<size_t>(data.size), shard);
  const bool was_training = model_.is_training();
  model_.eval();
  torch::NoGradGuard no_grad;
  double loss_sum = 0;
  int64_t correct = 0;
  bool scored = true;
  const auto batch = static_cast<size_t>(options_.eval_batch_size);
  const std::vector<size_t>& indices = sampler.indices();
  for (size_t begin = 0; begin < indices.size(); begin += batch) {
    const torch::Tensor rows = rows_of(indices, begin, std::min(indices.size(), begin + batch));
    auto [host_inputs, host_targets] = data.get(rows);
    const torch::Tensor inputs = host_inputs.to(options_.device);
    const torch::Tensor targets = host_targets.to(options_.device);
    torch::Tensor outputs, loss;
    {
      AutocastGuard autocast(torch::kBFloat16, options_.autocast_bf16, options_.device.type());
      outputs = forward_(inputs);
      loss = loss_(outputs, targets);
    }
    loss_sum += loss.item<double>() * static_cast<double>(rows.size(0));
    const int64_t c = scored ? correct_of(outputs, targets) : -1;
    if (c < 0) scored = false;
    correct += std::max<int64_t>(c, 0);
  }
  model_.train(was_training);
  // Sums over the ranks (means times the world: every rank has as many samples).
  const double count = static_cast<double>(indices.size());
  Logs out{{"loss", metric_average(loss_sum / count, "trainer/eval_loss", options_)}};
  if (scored) {
    out["accuracy"] =
        metric_average(static_cast<double>(correct) / count, "trainer/eval_accuracy", options_);
  }
  return out;
}

// --- Callbacks ---------------------------------------------------------------

void BroadcastGlobalVariables::on_train_begin(Trainer& trainer) {
  const int stage = trainer.optimizer().zero_stage();
  if (stage == 3) {
    throw ContractError(
        "kolo::BroadcastGlobalVariables: at zero_stage 3 the parameters are sharded; call "
        "kolo::broadcast_parameters(model, root) before building the optimizer instead");
  }
  broadcast_parameters(trainer.model(), root_, trainer.options());
  if (stage == 0)
    broadcast_optimizer_state(trainer.optimizer().optimizer(), root_, trainer.options());
}

void MetricAverage::on_epoch_end(Trainer& trainer, int64_t, Logs& logs) {
  for (auto& [name, value] : logs)
    value = metric_average(value, "trainer/" + name, trainer.options());
}

void LearningRateWarmup::on_train_begin(Trainer& trainer) {
  LrScheduleOptions o = make_options_(trainer);
  o.steps_per_epoch = std::max<int64_t>(1, trainer.steps_per_epoch());
  schedule_ = std::make_unique<LrSchedule>(o);
}

void LearningRateWarmup::on_batch_begin(Trainer& trainer, int64_t step) {
  lr_ = schedule_->lr(trainer.epoch(), step);
  apply_lr(trainer.optimizer().optimizer(), lr_);
}

void LearningRateWarmup::on_epoch_end(Trainer&, int64_t, Logs& logs) { logs["lr"] = lr_; }

void LearningRateSchedule::on_epoch_begin(Trainer& trainer, int64_t epoch) {
  if (epoch == applied_) return;  // resumed within the epoch: its rate is committed
  torch::optim::Optimizer& optimizer = trainer.optimizer().optimizer();
  apply_lr(optimizer, schedule_(epoch, current_lr(optimizer)));
  applied_ = epoch;
}

void LearningRateSchedule::load_state(const State& state) {
  const auto it = state.find("applied");
  applied_ = it == state.end() ? -1 : std::stoll(it->second);
}

void LearningRateSchedule::on_epoch_end(Trainer& trainer, int64_t, Logs& logs) {
  logs["lr"] = current_lr(trainer.optimizer().optimizer());
}

void Throughput::on_epoch_end(Trainer& trainer, int64_t, Logs& logs) {
  const double seconds = std::max(trainer.epoch_seconds(), 1e-9);
  const int workers = trainer.world_size();
  // Elastic: the world's samples over every round of the epoch, committed.
  const elastic::TrainerState* state = trainer.options().elastic;
  const double images = state ? state->totals().samples
                              : metric_average(static_cast<double>(trainer.samples_seen()),
                                               "trainer/images", trainer.options()) *
                                    workers;
  logs["epoch_time"] = seconds;
  logs["images"] = images;
  logs["images_per_sec"] = images / seconds;
  if (print_ && trainer.rank() == 0) {
    std::printf("Epoch time: %.1f s\n", seconds);
    std::printf("Images/sec: %.1f (%d worker(s), %.1f per worker)\n", images / seconds, workers,
                images / seconds / workers);
    std::fflush(stdout);
  }
}

namespace {

// "" when this process can create files in `dir` (created if missing), else
// why not. The probe file's name holds the rank and the pid, so that ranks
// sharing the directory (one host, or a shared filesystem) do not collide.
std::string checkpoint_dir_error(const std::string& dir, int rank) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return "cannot create the checkpoint directory '" + dir + "': " + ec.message();
  const std::string probe =
      (std::filesystem::path(dir) /
       (".kolo-write-test." + std::to_string(rank) + "." + std::to_string(::getpid())))
          .string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return "cannot create files in the checkpoint directory '" + dir +
           "': " + std::strerror(errno) +
           " (give ModelCheckpointOptions::dir a writable directory)";
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

}  // namespace

void ModelCheckpoint::on_train_begin(Trainer& trainer) {
  using Resume = ModelCheckpointOptions::Resume;
  // A directory the saves cannot write fails here, on every rank, not after
  // the first epoch. The ranks that write probe it: all at the ZeRO stages,
  // rank 0 at stage 0; a parameter-server worker writes nothing (its servers
  // save).
  ParallelOptimizer& optimizer = trainer.optimizer();
  const bool writes = dynamic_cast<ps::WorkerOptimizer*>(&optimizer) == nullptr &&
                      (optimizer.zero_stage() > 0 || optimizer.rank() == 0);
  agree_on_outcome(writes ? checkpoint_dir_error(options_.dir, optimizer.rank()) : "",
                   "kolo::ModelCheckpoint", "trainer/checkpoint_dir", trainer.options());
  if (options_.resume == Resume::kNo) return;
  if (options_.resume == Resume::kIfPresent) {
    // Every rank must take the same branch: rank 0's view of the directory
    // decides (an unreadable one counts as absent; loading it would fail).
    std::error_code ec;
    const bool present =
        std::filesystem::exists(std::filesystem::path(options_.dir) / "index.kolo", ec) && !ec;
    // (Rank 0 of the ranks the collectives run on: a parameter-server
    // worker of mode async or ssp decides alone, on an engine of its own.)
    const detail::SetPosition position =
        detail::set_position(engine_of(trainer.options(), "kolo::ModelCheckpoint"),
                             trainer.options().process_set, "kolo::ModelCheckpoint");
    const double any = metric_average(position.rank == 0 && present ? 1.0 : 0.0,
                                      "trainer/checkpoint_present", trainer.options()) *
                       position.size;
    if (any < 0.5) return;
  }
  const CheckpointState state = load_checkpoint(options_.dir, trainer.optimizer());
  trainer.set_initial_epoch(state.epoch);
  if (LossScaler* scaler = trainer.options().loss_scaler) scaler->restore(state.extras);
  if (options_.verbose && trainer.rank() == 0) {
    std::printf("Resumed from %s after epoch %lld\n", options_.dir.c_str(),
                static_cast<long long>(state.epoch));
    std::fflush(stdout);
  }
}

void ModelCheckpoint::on_epoch_end(Trainer& trainer, int64_t epoch, Logs&) {
  CheckpointState state;
  state.epoch = epoch + 1;  // epochs completed
  state.seed = trainer.options().sampling.seed;
  state.sampler = {epoch + 1, 0};
  if (const LossScaler* scaler = trainer.options().loss_scaler) state.extras = scaler->extras();
  save_checkpoint(options_.dir, trainer.optimizer(), state);
  if (options_.verbose && trainer.rank() == 0) {
    std::printf("Saved %s\n", options_.dir.c_str());
    std::fflush(stdout);
  }
}

EarlyStopping::EarlyStopping(std::string monitor, int patience, double min_delta, std::string mode)
    : monitor_(std::move(monitor)),
      mode_(std::move(mode)),
      patience_(patience),
      min_delta_(min_delta) {
  if (mode_ != "min" && mode_ != "max") {
    throw ContractError("kolo::EarlyStopping: mode \"" + mode_ + "\"; use \"min\" or \"max\"");
  }
  if (patience_ < 0) throw ContractError("kolo::EarlyStopping: patience must be >= 0");
}

void EarlyStopping::on_train_begin(Trainer&) {
  have_best_ = false;
  wait_ = 0;
  stopped_epoch_ = -1;
}

Callback::State EarlyStopping::save_state() const {
  char best[64];
  std::snprintf(best, sizeof(best), "%a", best_);
  return {{"best", best},
          {"have_best", have_best_ ? "1" : "0"},
          {"wait", std::to_string(wait_)},
          {"stopped_epoch", std::to_string(stopped_epoch_)}};
}

void EarlyStopping::load_state(const State& state) {
  if (state.empty()) return;  // committed before this callback was added
  try {
    best_ = std::strtod(state.at("best").c_str(), nullptr);
    have_best_ = state.at("have_best") == "1";
    wait_ = std::stoi(state.at("wait"));
    stopped_epoch_ = std::stoll(state.at("stopped_epoch"));
  } catch (const std::exception& e) {
    throw ContractError(
        std::string("kolo::EarlyStopping: a committed state without its entries (") + e.what() +
        "); was the callback list changed between rounds?");
  }
}

void EarlyStopping::on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) {
  const auto it = logs.find(monitor_);
  if (it == logs.end()) {
    throw ContractError("kolo::EarlyStopping: the logs have no \"" + monitor_ +
                        "\" (add a validation set for val_* metrics)");
  }
  const double value = metric_average(it->second, "trainer/early_stopping", trainer.options());
  const double gain = mode_ == "min" ? best_ - value : value - best_;
  if (!have_best_ || gain > min_delta_) {
    best_ = value;
    have_best_ = true;
    wait_ = 0;
    return;
  }
  if (++wait_ > patience_) {
    trainer.stop_training = true;
    stopped_epoch_ = epoch;
  }
}

void ProgressBar::print(int64_t step, int64_t steps, double elapsed_s, const Logs& logs,
                        bool done) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * step / std::max<int64_t>(steps, 1));
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - filled - 1), '.');
  const double per_step_ms = 1000.0 * elapsed_s / static_cast<double>(std::max<int64_t>(step, 1));
  const int width = static_cast<int>(std::to_string(steps).size());
  std::printf("%*lld/%lld [%s] - ", width, static_cast<long long>(step),
              static_cast<long long>(steps), bar.c_str());
  if (done) {
    std::printf("%.0fs %.0fms/step", elapsed_s, per_step_ms);
  } else {
    std::printf("ETA: %.0fs - %.0fms/step",
                per_step_ms * static_cast<double>(steps - step) / 1000.0, per_step_ms);
  }
  for (const char* name : {"loss", "accuracy"}) {
    const auto it = logs.find(name);
    if (it != logs.end()) std::printf(" - %s: %.4f", name, it->second);
  }
  std::printf("\n");
  std::fflush(stdout);
}

void ProgressBar::on_epoch_begin(Trainer& trainer, int64_t epoch) {
  start_ = now_s();
  if (trainer.rank() != 0) return;
  std::printf("Epoch %lld/%lld\n", static_cast<long long>(epoch + 1),
              static_cast<long long>(trainer.options().epochs));
  std::fflush(stdout);
}

void ProgressBar::on_batch_end(Trainer& trainer, int64_t step, Logs& logs) {
  const int64_t steps = trainer.steps_per_epoch();
  const int64_t every = std::max<int64_t>(1, steps / std::max(1, lines_));
  if (trainer.rank() != 0 || (step + 1) % every != 0 || step + 1 >= steps) return;
  print(step + 1, steps, now_s() - start_, logs, false);
}

void ProgressBar::on_epoch_end(Trainer& trainer, int64_t, Logs& logs) {
  if (trainer.rank() != 0) return;
  print(trainer.steps_per_epoch(), trainer.steps_per_epoch(), trainer.epoch_seconds(), logs, true);
}

// The columns and rows, each a line.
Callback::State CsvLogger::save_state() const {
  const auto lines = [](const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& item : items) out += item + "\n";
    return out;
  };
  return {{"columns", lines(columns_)}, {"rows", lines(rows_)}};
}

void CsvLogger::load_state(const State& state) {
  const auto lines = [&](const char* key) {
    std::vector<std::string> out;
    const auto it = state.find(key);
    if (it == state.end()) return out;
    size_t begin = 0;
    for (size_t end; (end = it->second.find('\n', begin)) != std::string::npos; begin = end + 1) {
      out.push_back(it->second.substr(begin, end - begin));
    }
    return out;
  };
  columns_ = lines("columns");
  rows_ = lines("rows");
}

void CsvLogger::on_epoch_end(Trainer& trainer, int64_t epoch, Logs& logs) {
  if (trainer.rank() != 0) return;
  if (columns_.empty()) {
    for (const auto& [name, value] : logs) columns_.push_back(name);
  }
  std::string row = std::to_string(epoch);
  for (const std::string& name : columns_) {
    const auto it = logs.find(name);
    char text[64] = "";
    if (it != logs.end()) std::snprintf(text, sizeof(text), "%.17g", it->second);
    row += std::string(",") + text;
  }
  rows_.push_back(row);
  std::string header = "epoch";
  for (const std::string& name : columns_) header += "," + name;
  // A path that is not a regular file (/dev/null, /dev/stdout, a FIFO) is
  // written in place, a row at a time: renaming the temporary file over it
  // would replace it (run as root, /dev/null itself became a regular file).
  std::error_code status_error;
  const auto status = std::filesystem::status(path_, status_error);
  if (!status_error && std::filesystem::exists(status) &&
      !std::filesystem::is_regular_file(status)) {
    std::ofstream out(path_, std::ios::app);
    if (rows_.size() == 1) out << header << "\n";
    out << row << "\n";
    out.flush();
    if (!out) throw ContractError("kolo::CsvLogger: cannot write '" + path_ + "'");
    return;
  }
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << header << "\n";
    for (const std::string& r : rows_) out << r << "\n";
    if (!out) throw ContractError("kolo::CsvLogger: cannot write '" + tmp + "'");
  }
  std::error_code error;
  std::filesystem::rename(tmp, path_, error);
  if (error) {
    throw ContractError("kolo::CsvLogger: cannot rename '" + tmp + "' to '" + path_ +
                        "': " + error.message());
  }
}

}  // namespace kolo
