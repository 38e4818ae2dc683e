// DistributedOptimizer (kolo/torch/optimizer.h): gradient hooks that start
// each allreduce inside backward(), and the step that waits for them.
#include "kolo/torch/optimizer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

#include <cmath>
#include <exception>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "common.h"
#include "kolo/core/errors.h"

namespace kolo {

namespace {

constexpr const char* kOp = "kolo::DistributedOptimizer";

c10::ScalarType compressed_type(Compression compression) {
  return compression == Compression::kFp16 ? torch::kHalf : torch::kBFloat16;
}

// Whether a gradient of this dtype is sent compressed: float32 and float64
// are, under kFp16 / kBf16; other dtypes go as they are.
bool compresses(Compression compression, c10::ScalarType type) {
  const bool floating = type == torch::kFloat || type == torch::kDouble;
  return compression != Compression::kNone && floating;
}

}  // namespace

Compression parse_compression(const std::string& name) {
  if (name == "none") return Compression::kNone;
  if (name == "fp16") return Compression::kFp16;
  if (name == "bf16") return Compression::kBf16;
  throw ContractError("kolo::parse_compression: unknown compression '" + name +
                      "'; use none, fp16 or bf16");
}

const char* compression_name(Compression compression) {
  switch (compression) {
    case Compression::kNone:
      return "none";
    case Compression::kFp16:
      return "fp16";
    case Compression::kBf16:
      return "bf16";
  }
  return "?";
}

// Everything the hooks touch. Owned by the DistributedOptimizer; the hooks
// hold weak pointers, so a hook that outlives its optimizer does nothing.
struct DistributedOptimizer::State {
  struct Slot {
    std::string name;  // request name: prefix + parameter name
    torch::Tensor param;
    // The parameter's AccumulateGrad node. Held so that the same node (and
    // our hooks on it) serves every backward pass: otherwise it dies with
    // each step's graph and the next forward creates a new one without hooks.
    std::shared_ptr<torch::autograd::Node> accumulator;
    torch::autograd::FunctionPreHook* pre_hook = nullptr;
    uintptr_t post_hook_key = 0;

    int passes = 0;          // backward passes that produced this gradient since the last sync
    bool submitted = false;  // its allreduce is running (or finished, not yet waited for)
    int64_t bytes = 0;       // the gradient's size as sent (numel x element size)
    TensorHandle handle;
    torch::Tensor buffer;       // compressed or contiguous staging copy, reused across steps
    torch::Tensor staged_from;  // the .grad() the buffer was filled from (copied back)
  };

  DistributedOptimizerOptions options;
  Engine* engine = nullptr;
  TensorOpOptions request;  // every gradient's allreduce options

  std::mutex mutex;
  std::vector<Slot> slots;
  bool synchronized = false;  // synchronize() ran and no gradient arrived since
  Stats stats;
  // The open bucket: gradients complete for this step (k-th pass done), in
  // the order they became ready, not yet submitted; and their bytes.
  std::vector<size_t> bucket;
  int64_t open_bytes = 0;
  size_t ready = 0;  // slots whose gradient is complete for this step

  // A new step: no gradient is complete and the bucket is empty.
  void forget_ready() {
    bucket.clear();
    open_bytes = 0;
    ready = 0;
  }

  // Pre-accumulate: a gradient that arrives while its allreduce is running
  // would be added into the buffer the engine is writing. Refuse it before
  // AccumulateGrad touches .grad().
  void before_accumulate(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    const Slot& slot = slots[index];
    if (slot.passes >= options.backward_passes_per_step) {
      throw ContractError(
          std::string(kOp) + ": the gradient of '" + slot.name +
          "' was computed again after its allreduce was started or queued: more than "
          "backward_passes_per_step (" +
          std::to_string(options.backward_passes_per_step) +
          ") backward passes before step(). Call step() (or synchronize()) after every " +
          std::to_string(options.backward_passes_per_step) +
          " backward passes, or raise DistributedOptimizerOptions::backward_passes_per_step");
    }
  }

  // Post-accumulate: .grad() now holds this pass's gradient.
  void after_accumulate(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    synchronized = false;
    Slot& slot = slots[index];
    if (++slot.passes < options.backward_passes_per_step) return;
    ++ready;
    bucket.push_back(index);
    open_bytes += slot.bytes;
    // Submit the bucket once it holds bucket_bytes, or when this was the
    // step's last gradient (nothing is left for backward() to overlap with).
    if (open_bytes < options.bucket_bytes && ready < slots.size()) return;
    torch::NoGradGuard no_grad;
    for (size_t i : bucket) submit(slots[i], /*from_hook=*/true);
    bucket.clear();
    open_bytes = 0;
  }

  // Starts the allreduce of slot.param's gradient. Caller holds the mutex.
  void submit(Slot& slot, bool from_hook) {
    torch::Tensor grad = slot.param.grad();
    if (!grad.defined()) {
      grad = torch::zeros_like(slot.param, at::MemoryFormat::Contiguous);
      slot.param.mutable_grad() = grad;
      ++stats.zero_filled;
    }
    torch::Tensor target = grad;
    const bool compress = compresses(options.compression, grad.scalar_type());
    if (compress || !grad.is_contiguous()) {
      const c10::ScalarType type =
          compress ? compressed_type(options.compression) : grad.scalar_type();
      if (!slot.buffer.defined() || slot.buffer.scalar_type() != type ||
          slot.buffer.sizes() != grad.sizes()) {
        slot.buffer = torch::empty(grad.sizes(), torch::TensorOptions().dtype(type));
      }
      slot.buffer.copy_(grad);
      slot.staged_from = grad;
      target = slot.buffer;
    }
    slot.handle = allreduce_async_(target, slot.name, request);
    slot.submitted = true;
    ++(from_hook ? stats.hook_submissions : stats.step_submissions);
  }

  void synchronize() {
    torch::NoGradGuard no_grad;
    std::lock_guard<std::mutex> lock(mutex);
    std::exception_ptr error;
    // Same order on every rank; the engine orders execution anyway.
    for (Slot& slot : slots) {
      if (slot.submitted) continue;
      try {
        submit(slot, /*from_hook=*/false);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    for (Slot& slot : slots) {
      if (!slot.submitted) continue;
      try {
        slot.handle.wait(options.timeout);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    for (Slot& slot : slots) {
      if (!error && slot.staged_from.defined()) slot.staged_from.copy_(slot.buffer);
      slot.staged_from = torch::Tensor();
      slot.handle = TensorHandle();
      slot.submitted = false;
      slot.passes = 0;
    }
    forget_ready();
    if (error) std::rethrow_exception(error);
    synchronized = true;
    ++stats.steps;
  }
};

namespace {

using torch::autograd::variable_list;

class BeforeAccumulateHook : public torch::autograd::FunctionPreHook {
 public:
  BeforeAccumulateHook(std::weak_ptr<DistributedOptimizer::State> state, size_t index)
      : state_(std::move(state)), index_(index) {}
  variable_list operator()(const variable_list& grads) override {
    if (auto state = state_.lock()) state->before_accumulate(index_);
    return grads;
  }

 private:
  std::weak_ptr<DistributedOptimizer::State> state_;
  size_t index_;
};

class AfterAccumulateHook : public torch::autograd::FunctionPostHook {
 public:
  AfterAccumulateHook(std::weak_ptr<DistributedOptimizer::State> state, size_t index)
      : state_(std::move(state)), index_(index) {}
  variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
    if (auto state = state_.lock()) state->after_accumulate(index_);
    return outputs;
  }

 private:
  std::weak_ptr<DistributedOptimizer::State> state_;
  size_t index_;
};

// Local validity of the options ("" = fine).
std::string check_options(const DistributedOptimizerOptions& o) {
  std::ostringstream error;
  if (o.op != ReduceOp::kAverage && o.op != ReduceOp::kSum) {
    error << "options.op is " << reduce_op_name(o.op)
          << "; gradients are reduced with ReduceOp::kAverage or ReduceOp::kSum";
  } else if (o.backward_passes_per_step < 1) {
    error << "options.backward_passes_per_step is " << o.backward_passes_per_step
          << "; it must be at least 1";
  } else if (!(o.gradient_predivide_factor > 0) || !std::isfinite(o.gradient_predivide_factor)) {
    error << "options.gradient_predivide_factor is " << o.gradient_predivide_factor
          << "; it must be a finite number > 0";
  } else if (o.bucket_bytes < 0) {
    error << "options.bucket_bytes is " << o.bucket_bytes
          << "; it must be at least 0 (0 = start each gradient's allreduce the moment it is "
             "ready)";
  } else if (o.gradient_predivide_factor != 1.0 && o.op != ReduceOp::kAverage) {
    error << "options.gradient_predivide_factor is " << o.gradient_predivide_factor << " with op "
          << reduce_op_name(o.op) << "; a predivide factor other than 1 needs ReduceOp::kAverage";
  }
  return error.str();
}

std::string options_manifest(const DistributedOptimizerOptions& o) {
  std::ostringstream out;
  out << "options op=" << reduce_op_name(o.op) << " compression=" << compression_name(o.compression)
      << " backward_passes_per_step=" << o.backward_passes_per_step
      << " gradient_predivide_factor=" << o.gradient_predivide_factor << "\n";
  return out.str();
}

std::vector<std::pair<std::string, torch::Tensor>> to_vector(
    const torch::OrderedDict<std::string, torch::Tensor>& named) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  out.reserve(named.size());
  for (const auto& item : named) out.emplace_back(item.key(), item.value());
  return out;
}

// "<g>.<j>" names for every parameter of the optimizer.
std::vector<std::pair<std::string, torch::Tensor>> index_names(
    const torch::optim::Optimizer& optimizer) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t j = 0; j < params.size(); ++j) {
      out.emplace_back(std::to_string(g) + "." + std::to_string(j), params[j]);
    }
  }
  return out;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(
    torch::optim::Optimizer& optimizer,
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    const DistributedOptimizerOptions& options)
    : DistributedOptimizer(optimizer, to_vector(named_parameters), options) {}

DistributedOptimizer::DistributedOptimizer(torch::optim::Optimizer& optimizer,
                                           const DistributedOptimizerOptions& options)
    : DistributedOptimizer(optimizer, index_names(optimizer), options) {}

DistributedOptimizer::DistributedOptimizer(
    torch::optim::Optimizer& optimizer,
    const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
    const DistributedOptimizerOptions& options)
    : optimizer_(optimizer), state_(std::make_shared<State>()) {
  State& state = *state_;
  state.options = options;
  CallOptions call;
  call.engine = options.engine;
  call.process_set = options.process_set;
  call.timeout = options.timeout;
  state.engine = &engine_of(call);
  call.engine = state.engine;

  // Every optimizer parameter, named; problems are collected, not thrown, so
  // that every rank still takes part in the check below.
  std::string error = check_options(options);
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& [name, tensor] : named_parameters) {
    if (tensor.defined()) names.emplace(tensor.unsafeGetTensorImpl(), name);
  }
  std::vector<std::pair<std::string, torch::Tensor>> params;  // optimizer order
  std::unordered_map<const c10::TensorImpl*, int> seen;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size() && error.empty(); ++g) {
    const auto& group_params = groups[g].params();
    for (size_t j = 0; j < group_params.size(); ++j) {
      const torch::Tensor& p = group_params[j];
      const std::string where =
          "parameter " + std::to_string(j) + " of parameter group " + std::to_string(g);
      auto it = names.find(p.unsafeGetTensorImpl());
      if (it == names.end()) {
        error = where +
                " has no name in named_parameters; pass model->named_parameters() of the "
                "model whose parameters the optimizer holds";
        break;
      }
      if (!seen.emplace(p.unsafeGetTensorImpl(), 0).second) {
        error = where + " ('" + it->second + "') appears twice in the optimizer";
        break;
      }
      if (p.requires_grad() && !p.is_leaf()) {
        error = where + " ('" + it->second +
                "') is not a leaf tensor (it was computed from other tensors); optimizers "
                "step leaf parameters only";
        break;
      }
      params.emplace_back(it->second, p);
    }
  }

  // Compare with rank 0 of the set: names, dtypes, shapes, requires_grad and
  // options, so that a difference is an error everywhere rather than a stall
  // on the first gradient one rank never submits.
  std::vector<std::pair<std::string, torch::Tensor>> described;
  described.reserve(params.size());
  for (const auto& [name, p] : params) {
    described.emplace_back(
        options.name_prefix + name + (p.requires_grad() ? "" : " (requires_grad=false)"), p);
  }
  const std::string mine = options_manifest(options) + detail::tensor_manifest(described);
  const std::string check_name = "DistributedOptimizer[" + options.name_prefix + "]";
  const detail::SetPosition position =
      detail::set_position(*state.engine, options.process_set, check_name, call);
  const std::string roots = detail::broadcast_from_root([&] { return mine; }, /*root=*/0, position,
                                                        check_name + ".manifest", call);
  if (error.empty()) {
    error = detail::manifest_difference(roots, mine);
    if (!error.empty()) error = "differs from rank 0 of the process set: " + error;
  }
  detail::agree_on_outcome(error, kOp, check_name + ".check", call);

  const int k = options.backward_passes_per_step;
  state.request.engine = state.engine;
  state.request.process_set = options.process_set;
  state.request.timeout = options.timeout;
  state.request.op = options.op;
  if (options.op == ReduceOp::kAverage) {
    state.request.prescale = 1.0 / (options.gradient_predivide_factor * k);
    state.request.postscale = options.gradient_predivide_factor;
  } else {
    state.request.prescale = 1.0 / k;
  }

  for (const auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    State::Slot slot;
    slot.name = options.name_prefix + name;
    slot.param = p;
    slot.accumulator = torch::autograd::impl::grad_accumulator(p);
    slot.bytes = p.numel() * (compresses(options.compression, p.scalar_type())
                                  ? int64_t{2}  // fp16 and bf16
                                  : static_cast<int64_t>(p.element_size()));
    state.slots.push_back(std::move(slot));
  }
  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < state.slots.size(); ++i) {
    State::Slot& slot = state.slots[i];
    auto pre = std::make_unique<BeforeAccumulateHook>(weak, i);
    slot.pre_hook = pre.get();
    slot.accumulator->add_pre_hook(std::move(pre));
    slot.post_hook_key =
        slot.accumulator->add_post_hook(std::make_unique<AfterAccumulateHook>(weak, i));
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  for (State::Slot& slot : state_->slots) {
    slot.accumulator->del_post_hook(slot.post_hook_key);
    auto& pre_hooks = slot.accumulator->pre_hooks();
    for (auto it = pre_hooks.begin(); it != pre_hooks.end(); ++it) {
      if (it->get() == slot.pre_hook) {
        pre_hooks.erase(it);
        break;
      }
    }
  }
}

torch::Tensor DistributedOptimizer::step() {
  bool synchronized;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    synchronized = state_->synchronized;
  }
  if (!synchronized) state_->synchronize();
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->synchronized = false;
  }
  return optimizer_.step();
}

void DistributedOptimizer::synchronize() { state_->synchronize(); }

void DistributedOptimizer::zero_grad() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    for (const State::Slot& slot : state_->slots) {
      if (slot.submitted) {
        throw ContractError(std::string(kOp) +
                            "::zero_grad: called after backward() started the allreduce of '" +
                            slot.name +
                            "' but before step() or synchronize() waited for it (the allreduce "
                            "still writes into the gradient); call step() or synchronize() "
                            "first");
      }
    }
    // A gradient completed for this step but still queued in the open bucket
    // (a parameter unused on this rank keeps the bucket open until step()).
    // Refused like a running allreduce: whether a gradient has left its
    // bucket depends on bucket_bytes and on which parameters this rank used,
    // so allowing it would make zero_grad() fail on some ranks and not others.
    if (!state_->bucket.empty()) {
      throw ContractError(std::string(kOp) +
                          "::zero_grad: called after backward() completed the gradient of '" +
                          state_->slots[state_->bucket.front()].name +
                          "' (queued in a bucket for its allreduce) but before step() or "
                          "synchronize(); call step() or synchronize() first");
    }
    for (State::Slot& slot : state_->slots) slot.passes = 0;
    state_->forget_ready();
    state_->synchronized = false;
  }
  optimizer_.zero_grad();
}

const DistributedOptimizerOptions& DistributedOptimizer::options() const { return state_->options; }

std::vector<std::string> DistributedOptimizer::gradient_names() const {
  std::vector<std::string> names;
  names.reserve(state_->slots.size());
  for (const State::Slot& slot : state_->slots) names.push_back(slot.name);
  return names;
}

DistributedOptimizer::Stats DistributedOptimizer::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

}  // namespace kolo
