// Pipeline parallelism (kolo/torch/pipeline.h).
#include "kolo/torch/pipeline.h"

#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/torch/p2p.h"

namespace kolo {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& p : module.parameters()) count += p.numel();
  return count;
}

int64_t tensor_bytes(const torch::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()) : 0;
}

// Rows [start, start + size) of each micro-batch: the first rows % m get one more.
std::vector<std::pair<int64_t, int64_t>> micro_ranges(int64_t rows, int m) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t start = 0;
  for (int k = 0; k < m; ++k) {
    const int64_t size = rows / m + (k < rows % m ? 1 : 0);
    ranges.emplace_back(start, size);
    start += size;
  }
  return ranges;
}

// Codes of the partition handshake's verdict (see the constructor).
enum Verdict : int64_t {
  kAgreed = 0,
  kBadSizes = 1,        // stage 0: stage_sizes do not describe the model
  kStageCount = 2,      // a rank counts another number of stages
  kModuleCount = 3,     // a rank's model has another number of modules
  kParameterCount = 4,  // a module has another parameter count
  kSchedule = 5,        // a rank runs another schedule
  kMicroBatches = 6,    // a rank cuts the batch into another number of micro-batches
  kAveraging = 7        // a rank sets optimizer_averages_micro_batches otherwise
};

}  // namespace

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::kGPipe;
  if (name == "1f1b") return PipelineSchedule::k1F1B;
  throw ContractError("kolo pipeline: unknown schedule '" + name + "'; use gpipe or 1f1b");
}

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::kGPipe ? "gpipe" : "1f1b";
}

uint64_t pipeline_seed(uint64_t seed, int64_t step, int micro_batch, int stage) {
  // splitmix64 over the four numbers: independent streams per (step, micro-batch, stage).
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t x = mix(seed);
  x = mix(x ^ static_cast<uint64_t>(step));
  x = mix(x ^ static_cast<uint64_t>(micro_batch));
  x = mix(x ^ static_cast<uint64_t>(stage));
  return x >> 1;  // torch's seeds are taken as int64 in places
}

std::vector<int64_t> balance_costs(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  if (stages < 1 || stages > n) {
    throw ContractError("kolo pipeline: cannot cut " + std::to_string(n) + " modules into " +
                        std::to_string(stages) + " stages (every stage needs at least one module)");
  }
  // best[k][i]: the smallest possible largest part when modules [0, i) make k parts.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double value = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        // Ties go to the later cut: modules without cost (activations)
        // stay with the stage before them.
        if (value <= best[k][i]) {
          best[k][i] = value;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int64_t> sizes(stages);
  for (int k = stages, i = n; k >= 1; --k) {
    sizes[k - 1] = i - cut[k][i];
    i = cut[k][i];
  }
  return sizes;
}

std::vector<int64_t> balance_by_parameters(const torch::nn::Sequential& model, int stages) {
  std::vector<double> costs;
  for (const auto& module : model->children()) {
    costs.push_back(static_cast<double>(parameter_count(*module)));
  }
  return balance_costs(costs, stages);
}

std::vector<int64_t> balance_by_time(torch::nn::Sequential model, int stages,
                                     const torch::Tensor& sample, int repeats) {
  if (!sample.defined()) {
    throw ContractError(
        "kolo pipeline: balancing by time needs a sample micro-batch "
        "(PipelineOptions::balance_sample)");
  }
  std::vector<std::vector<double>> runs(model->size());
  for (int r = 0; r < std::max(1, repeats); ++r) {
    torch::Tensor x = sample;
    size_t i = 0;
    for (auto& module : *model) {
      torch::Tensor input = x.detach();
      if (input.is_floating_point()) input.requires_grad_(true);
      const auto start = Clock::now();
      torch::Tensor out = module.forward(input);
      if (out.requires_grad()) out.backward(torch::ones_like(out));
      runs[i++].push_back(seconds_since(start));
      x = out.detach();
    }
  }
  for (auto& p : model->parameters()) {
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();  // measuring left no gradients
  }
  std::vector<double> costs;
  for (auto& times : runs) {
    std::sort(times.begin(), times.end());
    costs.push_back(times[times.size() / 2]);
  }
  return balance_costs(costs, stages);
}

struct Pipeline::Impl {
  PipelineOptions options;
  Communicator* comm = nullptr;
  std::vector<int> ranks;  // stage -> rank of comm
  int stage = 0;
  std::vector<int64_t> sizes;
  int64_t first = 0;
  torch::nn::Sequential module{nullptr};
  int64_t steps = 0;
  Stats stats;

  P2PTensorOptions p2p(int tag_offset) const {
    P2PTensorOptions o;
    o.communicator = comm;
    o.tag = options.tag + tag_offset;
    o.timeout = options.timeout;
    return o;
  }
  int stages() const { return static_cast<int>(ranks.size()); }
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == stages() - 1; }

  void agree_on_partition(const torch::nn::Sequential& model);
  [[noreturn]] void fail(int64_t verdict, int64_t at, int64_t a, int64_t b) const;

  // Runs the stage's modules on one micro-batch; returns the output and adds
  // the activation bytes it keeps to `bytes`.
  torch::Tensor run_modules(const torch::Tensor& input, int64_t* bytes);
};

// The first stage decides the partition and sends it, with every module's
// parameter count, down the pipeline; each stage checks it against its own
// model and its own step plan (schedule, micro-batches, who averages them:
// stages that disagree there would deadlock or scale gradients unevenly);
// the last stage sends the verdict back up. Message:
// [verdict, at, a, b, stages, modules, schedule, micro_batches, averages,
//  sizes..., counts...].
void Pipeline::Impl::agree_on_partition(const torch::nn::Sequential& model) {
  const int p = stages();
  const int64_t n = static_cast<int64_t>(model->size());
  std::vector<int64_t> counts;
  for (const auto& child : model->children()) counts.push_back(parameter_count(*child));
  constexpr int64_t kHeader = 9;
  const int64_t schedule = static_cast<int64_t>(options.schedule);
  const int64_t averages = options.optimizer_averages_micro_batches ? 1 : 0;
  std::vector<int64_t> message;
  if (first_stage()) {
    message = {kAgreed, 0, 0, 0, p, n, schedule, options.micro_batches, averages};
    std::vector<int64_t> decided;
    try {
      switch (options.balance) {
        case PipelineBalance::kManual:
          decided = options.stage_sizes;
          break;
        case PipelineBalance::kParameters:
          decided = balance_by_parameters(model, p);
          break;
        case PipelineBalance::kTime:
          decided = balance_by_time(model, p, options.balance_sample);
          break;
      }
    } catch (const ContractError&) {
      decided.clear();
    }
    int64_t total = 0;
    bool valid = static_cast<int>(decided.size()) == p;
    for (int64_t size : decided) {
      valid = valid && size >= 1;
      total += size;
    }
    if (!valid || total != n) {
      message[0] = kBadSizes;
      decided.assign(p, 0);
    }
    message.insert(message.end(), decided.begin(), decided.end());
    message.insert(message.end(), counts.begin(), counts.end());
  } else {
    const torch::Tensor received = recv(ranks[stage - 1], p2p(0));
    message.assign(received.data_ptr<int64_t>(), received.data_ptr<int64_t>() + received.numel());
    if (message[0] == kAgreed) {
      if (message[4] != p) {
        message[0] = kStageCount;
        message[1] = stage;
        message[2] = message[4];
        message[3] = p;
      } else if (message[5] != n) {
        message[0] = kModuleCount;
        message[1] = stage;
        message[2] = message[5];
        message[3] = n;
      } else if (message[6] != schedule) {
        message[0] = kSchedule;
        message[1] = stage;
        message[2] = message[6];
        message[3] = schedule;
      } else if (message[7] != options.micro_batches) {
        message[0] = kMicroBatches;
        message[1] = stage;
        message[2] = message[7];
        message[3] = options.micro_batches;
      } else if (message[8] != averages) {
        message[0] = kAveraging;
        message[1] = stage;
        message[2] = message[8];
        message[3] = averages;
      } else {
        for (int64_t i = 0; i < n; ++i) {
          if (message[kHeader + p + i] != counts[i]) {
            message[0] = kParameterCount;
            message[1] = stage;
            message[2] = i;
            message[3] = counts[i];
            break;
          }
        }
      }
    }
  }
  torch::Tensor verdict;
  if (!last_stage()) {
    send(torch::tensor(message, torch::kLong), ranks[stage + 1], p2p(0));
    verdict = recv(ranks[stage + 1], p2p(1));
  } else {
    verdict =
        torch::tensor(std::vector<int64_t>(message.begin(), message.begin() + 4), torch::kLong);
  }
  if (!first_stage()) send(verdict, ranks[stage - 1], p2p(1));
  const int64_t* v = verdict.data_ptr<int64_t>();
  if (v[0] != kAgreed) fail(v[0], v[1], v[2], v[3]);
  sizes.assign(message.begin() + kHeader, message.begin() + kHeader + p);
  first = 0;
  for (int s = 0; s < stage; ++s) first += sizes[s];
}

void Pipeline::Impl::fail(int64_t verdict, int64_t at, int64_t a, int64_t b) const {
  const std::string where = "stage " + std::to_string(at) + " (rank " +
                            std::to_string(ranks[static_cast<size_t>(at)]) + ")";
  switch (verdict) {
    case kBadSizes:
      throw ContractError(
          "kolo pipeline: the stage sizes do not describe the model: " +
          std::string(options.balance == PipelineBalance::kManual
                          ? "PipelineOptions::stage_sizes must hold one positive module count "
                            "per stage, summing to the Sequential's size"
                          : "it has fewer modules than there are stages") +
          " (decided by stage 0's rank " + std::to_string(ranks[0]) + ")");
    case kStageCount:
      throw ContractError("kolo pipeline: stage 0 counts " + std::to_string(a) + " stages, " +
                          where + " counts " + std::to_string(b) +
                          "; every stage must pass the same stage_ranks");
    case kModuleCount:
      throw ContractError("kolo pipeline: stage 0's model has " + std::to_string(a) + " modules, " +
                          where + "'s has " + std::to_string(b) +
                          "; every stage must build the same Sequential");
    case kParameterCount:
      throw ContractError("kolo pipeline: module " + std::to_string(a) + " of " + where +
                          "'s model has " + std::to_string(b) +
                          " parameters, not as many as stage 0's; every stage must build the "
                          "same Sequential");
    case kSchedule:
      throw ContractError("kolo pipeline: stage 0 runs the " +
                          std::string(pipeline_schedule_name(static_cast<PipelineSchedule>(a))) +
                          " schedule, " + where + " runs " +
                          pipeline_schedule_name(static_cast<PipelineSchedule>(b)) +
                          "; every stage must pass the same PipelineOptions::schedule");
    case kMicroBatches:
      throw ContractError("kolo pipeline: stage 0 cuts each batch into " + std::to_string(a) +
                          " micro-batches, " + where + " into " + std::to_string(b) +
                          "; every stage must pass the same PipelineOptions::micro_batches");
    case kAveraging:
      throw ContractError("kolo pipeline: PipelineOptions::optimizer_averages_micro_batches is " +
                          std::string(a ? "true" : "false") + " on stage 0 and " +
                          (b ? "true" : "false") + " on " + where +
                          "; every stage must scale its gradients the same way");
  }
  throw ContractError("kolo pipeline: the stages disagree (verdict " + std::to_string(verdict) +
                      ")");
}

torch::Tensor Pipeline::Impl::run_modules(const torch::Tensor& input, int64_t* bytes) {
  torch::Tensor x = input;
  *bytes += tensor_bytes(input);
  for (auto& m : *module) {
    x = m.forward(x);
    *bytes += tensor_bytes(x);
  }
  return x;
}

Pipeline::Pipeline(torch::nn::Sequential model, const PipelineOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.options = options;
  s.comm = options.communicator != nullptr ? options.communicator : &kolo::runtime().world();
  if (!model) throw ContractError("kolo pipeline: the Sequential is null");
  if (options.micro_batches < 1) {
    throw ContractError("kolo pipeline: micro_batches must be >= 1, got " +
                        std::to_string(options.micro_batches));
  }
  if (options.tag < 0 || options.tag + 1 > kMaxP2PTag) {
    throw ContractError("kolo pipeline: tag " + std::to_string(options.tag) + " is not in [0, " +
                        std::to_string(kMaxP2PTag - 1) + "]");
  }
  s.ranks = options.stage_ranks;
  if (s.ranks.empty()) {
    for (int r = 0; r < s.comm->size(); ++r) s.ranks.push_back(r);
  }
  std::set<int> unique(s.ranks.begin(), s.ranks.end());
  const auto mine = std::find(s.ranks.begin(), s.ranks.end(), s.comm->rank());
  if (unique.size() != s.ranks.size() || *unique.begin() < 0 ||
      *unique.rbegin() >= s.comm->size() || mine == s.ranks.end()) {
    std::string listed;
    for (int r : s.ranks) listed += (listed.empty() ? "" : ", ") + std::to_string(r);
    throw ContractError("kolo pipeline: stage_ranks [" + listed +
                        "] must be distinct ranks of the " + std::to_string(s.comm->size()) +
                        "-rank communicator and include this rank (" +
                        std::to_string(s.comm->rank()) + ")");
  }
  s.stage = static_cast<int>(mine - s.ranks.begin());
  if (static_cast<int64_t>(model->size()) < s.stages()) {
    throw ContractError("kolo pipeline: " + std::to_string(model->size()) +
                        " modules cannot make " + std::to_string(s.stages()) +
                        " stages (every stage needs at least one module)");
  }
  if (s.stages() > 1) {
    s.agree_on_partition(model);
  } else {
    s.sizes = {static_cast<int64_t>(model->size())};
  }
  s.module = torch::nn::Sequential();
  int64_t index = 0;
  for (auto& m : *model) {
    if (index >= s.first && index < s.first + s.sizes[s.stage]) {
      s.module->push_back(std::to_string(index), m);
    }
    ++index;
  }
}

Pipeline::~Pipeline() = default;

int Pipeline::stage() const { return impl_->stage; }
int Pipeline::stages() const { return impl_->stages(); }
int64_t Pipeline::first_module() const { return impl_->first; }
const std::vector<int64_t>& Pipeline::stage_sizes() const { return impl_->sizes; }
torch::nn::Sequential& Pipeline::module() { return impl_->module; }
std::vector<torch::Tensor> Pipeline::parameters() const { return impl_->module->parameters(); }
const Pipeline::Stats& Pipeline::stats() const { return impl_->stats; }

torch::Tensor Pipeline::train_step(const torch::Tensor& inputs, const torch::Tensor& targets,
                                   const PipelineLoss& loss_fn) {
  Impl& s = *impl_;
  const int m = s.options.micro_batches;
  const int p = s.stages();
  const auto step_start = Clock::now();
  const int64_t step = s.steps++;
  Stats stats;
  std::vector<std::pair<int64_t, int64_t>> input_ranges, target_ranges;
  if (s.first_stage()) {
    if (!inputs.defined() || inputs.dim() == 0 || inputs.size(0) < m) {
      throw ContractError("kolo pipeline train_step: stage 0 needs inputs with at least " +
                          std::to_string(m) + " rows (one per micro-batch), got " +
                          (inputs.defined() ? std::to_string(inputs.dim() ? inputs.size(0) : 0)
                                            : std::string("an undefined tensor")));
    }
    input_ranges = micro_ranges(inputs.size(0), m);
  }
  int64_t batch_rows = 0;
  if (s.last_stage()) {
    if (!targets.defined() || targets.dim() == 0 || targets.size(0) < m) {
      throw ContractError("kolo pipeline train_step: the last stage needs targets with at least " +
                          std::to_string(m) + " rows (one per micro-batch)");
    }
    if (!loss_fn) throw ContractError("kolo pipeline train_step: the loss function is empty");
    batch_rows = targets.size(0);
    target_ranges = micro_ranges(batch_rows, m);
  }

  // Per micro-batch state between its forward and its backward.
  struct Live {
    torch::Tensor input;   // requires grad on stages > 0
    torch::Tensor output;  // or the scaled loss on the last stage
    int64_t bytes = 0;
  };
  std::map<int, Live> live;
  int64_t live_bytes = 0;
  std::vector<TensorP2PHandle> sends;
  torch::Tensor loss_sum = torch::zeros({}, torch::kDouble);

  auto forward = [&](int k) {
    Live entry;
    if (s.first_stage()) {
      entry.input = inputs.narrow(0, input_ranges[k].first, input_ranges[k].second);
    } else {
      entry.input = recv(s.ranks[s.stage - 1], s.p2p(0));
      if (entry.input.is_floating_point()) entry.input.requires_grad_(true);
    }
    std::unique_lock<std::mutex> rng;
    if (s.options.seed) {
      if (s.options.rng_mutex != nullptr) rng = std::unique_lock<std::mutex>(*s.options.rng_mutex);
      torch::manual_seed(pipeline_seed(*s.options.seed, step, k, s.stage));
    }
    const auto start = Clock::now();
    torch::Tensor out = s.run_modules(entry.input, &entry.bytes);
    if (s.last_stage()) {
      const torch::Tensor target =
          targets.narrow(0, target_ranges[k].first, target_ranges[k].second);
      if (out.dim() == 0 || out.size(0) != target.size(0)) {
        // Stage 0 cut a batch of another size (a --batch that differs
        // between the ranks): the loss would fail inside torch.
        throw ContractError(
            "kolo pipeline train_step: micro-batch " + std::to_string(k) + " of " +
            std::to_string(m) + " reached the last stage with " +
            std::to_string(out.dim() ? out.size(0) : 0) + " rows, its targets have " +
            std::to_string(target.size(0)) + " (this stage's batch has " +
            std::to_string(batch_rows) +
            " rows); stage 0's inputs and the last stage's targets must have the same rows");
      }
      torch::Tensor loss = loss_fn(out, target);
      loss_sum += loss.detach().to(torch::kDouble) *
                  (static_cast<double>(target_ranges[k].second) / batch_rows);
      const double scale = static_cast<double>(target_ranges[k].second) / batch_rows *
                           (s.options.optimizer_averages_micro_batches ? m : 1);
      entry.output = loss * scale;
    } else {
      entry.output = out;
    }
    stats.busy_seconds += seconds_since(start);
    if (rng.owns_lock()) rng.unlock();
    if (!s.last_stage()) sends.push_back(isend(out.detach(), s.ranks[s.stage + 1], s.p2p(0)));
    live_bytes += entry.bytes;
    live.emplace(k, std::move(entry));
    stats.peak_activation_bytes = std::max(stats.peak_activation_bytes, live_bytes);
    stats.max_live_micro_batches =
        std::max(stats.max_live_micro_batches, static_cast<int>(live.size()));
  };

  auto backward = [&](int k) {
    Live entry = std::move(live.at(k));
    live.erase(k);
    torch::Tensor grad;
    if (!s.last_stage()) {
      // The gradient has the shape and dtype of the output this stage sent,
      // so its header and payload receives are posted together: the payload
      // moves as soon as the next stage sends it, without a second exchange
      // after the header (which would cost a wake-up of the sender's side).
      grad = recv_(torch::empty_like(entry.output, torch::MemoryFormat::Contiguous),
                   s.ranks[s.stage + 1], s.p2p(1));
    }
    const auto start = Clock::now();
    if (entry.output.requires_grad()) {
      if (s.last_stage()) {
        entry.output.backward();
      } else {
        torch::autograd::backward({entry.output}, {grad});
      }
    }
    stats.busy_seconds += seconds_since(start);
    if (!s.first_stage()) {
      torch::Tensor input_grad = entry.input.grad();
      if (!input_grad.defined()) input_grad = torch::zeros_like(entry.input);
      sends.push_back(isend(input_grad, s.ranks[s.stage - 1], s.p2p(1)));
    }
    live_bytes -= entry.bytes;
  };

  if (s.options.schedule == PipelineSchedule::kGPipe) {
    for (int k = 0; k < m; ++k) forward(k);
    for (int k = 0; k < m; ++k) backward(k);
  } else {
    const int warmup = std::min(p - s.stage - 1, m);
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int i = 0; i < m - warmup; ++i) {
      forward(warmup + i);
      backward(i);
    }
    for (int i = m - warmup; i < m; ++i) backward(i);
  }
  for (auto& handle : sends) handle.wait();
  stats.step_seconds = seconds_since(step_start);
  s.stats = stats;
  return s.last_stage() ? loss_sum.to(torch::kFloat) : torch::Tensor();
}

torch::Tensor Pipeline::forward(const torch::Tensor& inputs) {
  Impl& s = *impl_;
  const int m = s.options.micro_batches;
  torch::NoGradGuard no_grad;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  if (s.first_stage()) {
    if (!inputs.defined() || inputs.dim() == 0 || inputs.size(0) < m) {
      throw ContractError("kolo pipeline forward: stage 0 needs inputs with at least " +
                          std::to_string(m) + " rows (one per micro-batch)");
    }
    ranges = micro_ranges(inputs.size(0), m);
  }
  std::vector<TensorP2PHandle> sends;
  std::vector<torch::Tensor> outputs;
  for (int k = 0; k < m; ++k) {
    const torch::Tensor input = s.first_stage()
                                    ? inputs.narrow(0, ranges[k].first, ranges[k].second)
                                    : recv(s.ranks[s.stage - 1], s.p2p(0));
    int64_t ignored = 0;
    torch::Tensor out = s.run_modules(input, &ignored);
    if (s.last_stage()) {
      outputs.push_back(out);
    } else {
      sends.push_back(isend(out, s.ranks[s.stage + 1], s.p2p(0)));
    }
  }
  for (auto& handle : sends) handle.wait();
  return s.last_stage() ? torch::cat(outputs, 0) : torch::Tensor();
}

}  // namespace kolo
