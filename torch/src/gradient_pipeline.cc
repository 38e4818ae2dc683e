// The gradient pipeline (gradient_pipeline.h): hooks, passes, readiness,
// buckets and the end of a step.
#include "gradient_pipeline.h"

#include <torch/csrc/autograd/variable.h>
#include <torch/utils.h>

#include <algorithm>
#include <deque>

#include "kolo/core/errors.h"

namespace kolo::detail {

using torch::autograd::variable_list;

class PipelinePreHook : public torch::autograd::FunctionPreHook {
 public:
  PipelinePreHook(std::weak_ptr<GradientPipeline> pipeline, size_t index)
      : pipeline_(std::move(pipeline)), index_(index) {}
  variable_list operator()(const variable_list& grads) override {
    if (auto pipeline = pipeline_.lock()) pipeline->before_accumulate(index_);
    return grads;
  }

 private:
  std::weak_ptr<GradientPipeline> pipeline_;
  size_t index_;
};

class PipelinePostHook : public torch::autograd::FunctionPostHook {
 public:
  PipelinePostHook(std::weak_ptr<GradientPipeline> pipeline, size_t index)
      : pipeline_(std::move(pipeline)), index_(index) {}
  variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
    if (auto pipeline = pipeline_.lock()) pipeline->after_accumulate(index_);
    return outputs;
  }

 private:
  std::weak_ptr<GradientPipeline> pipeline_;
  size_t index_;
};

GradientPipeline::GradientPipeline(Options options, Policy& policy)
    : options_(std::move(options)), policy_(policy) {}

GradientPipeline::~GradientPipeline() { remove_hooks(); }

int GradientPipeline::add(const std::string& name, const torch::Tensor& param, int group) {
  GradParam p;
  p.name = name;
  p.param = param;
  p.group = group;
  p.numel = param.numel();
  params.push_back(std::move(p));
  return static_cast<int>(params.size()) - 1;
}

void GradientPipeline::set_layout(const std::vector<std::vector<int>>& layout) {
  std::lock_guard<std::mutex> lock(mutex);
  if (in_flight() || !order_.empty()) {
    throw ContractError(options_.op + ": internal: the bucket layout changed during a step");
  }
  buckets.clear();
  for (const std::vector<int>& members : layout) {
    GradBucket bucket;
    bucket.name = "b" + std::to_string(buckets.size());
    bucket.params = members;
    if (!members.empty()) {
      bucket.dtype = params[members.front()].param.scalar_type();
      bucket.device = params[members.front()].param.device();
    }
    for (int index : members) {
      GradParam& p = params[index];
      if (p.param.device() != bucket.device) {
        throw ContractError(options_.op + ": parameter '" + p.name + "' is on " +
                            p.param.device().str() + " but '" + params[members.front()].name +
                            "' is on " + bucket.device.str() +
                            "; kolo's optimizers take a model on one device (model->to(device))");
      }
      if (p.param.scalar_type() != bucket.dtype) {
        throw ContractError(options_.op + ": internal: bucket " + bucket.name + " mixes dtypes ('" +
                            p.name + "')");
      }
      p.bucket = static_cast<int>(buckets.size());
      p.offset = bucket.numel;
      bucket.numel += p.numel;
    }
    buckets.push_back(std::move(bucket));
  }
}

void GradientPipeline::install_hooks(const std::weak_ptr<GradientPipeline>& self) {
  for (size_t i = 0; i < params.size(); ++i) {
    GradParam& p = params[i];
    p.accumulator = torch::autograd::impl::grad_accumulator(p.param);
    auto pre = std::make_unique<PipelinePreHook>(self, i);
    p.pre_hook = pre.get();
    p.accumulator->add_pre_hook(std::move(pre));
    p.post_hook_key = p.accumulator->add_post_hook(std::make_unique<PipelinePostHook>(self, i));
  }
  hooked_ = true;
}

void GradientPipeline::remove_hooks() {
  if (!hooked_) return;
  for (GradParam& p : params) {
    p.accumulator->del_post_hook(p.post_hook_key);
    auto& pre_hooks = p.accumulator->pre_hooks();
    for (auto it = pre_hooks.begin(); it != pre_hooks.end(); ++it) {
      if (it->get() == p.pre_hook) {
        pre_hooks.erase(it);
        break;
      }
    }
  }
  hooked_ = false;
}

// --- Flat buffers --------------------------------------------------------------

torch::Tensor GradientPipeline::slot(const torch::Tensor& flat, int i) const {
  const GradParam& p = params[i];
  return flat.narrow(0, p.offset, p.numel).view(p.param.sizes());
}

torch::Tensor GradientPipeline::grad_slot(const torch::Tensor& flat, int i) const {
  const torch::Tensor view = slot(flat, i);
  torch::NoGradGuard no_grad;
  torch::Tensor alias = torch::empty({0}, flat.options());
  alias.set_(flat.storage(), view.storage_offset(), view.sizes(), view.strides());
  return alias;
}

void GradientPipeline::count_copy(int64_t bytes) {
  ++stats_.copies;
  stats_.copied_bytes += static_cast<uint64_t>(bytes);
}

void GradientPipeline::point_grads(int b, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  for (int index : buckets[b].params) {
    GradParam& p = params[index];
    const torch::Tensor target = grad_slot(flat, index);
    const torch::Tensor& grad = p.param.grad();
    if (occupies(grad, target)) continue;
    if (grad.defined()) {
      target.copy_(grad);
      count_copy(target.nbytes());
    } else {
      target.zero_();
    }
    p.param.mutable_grad() = target;
  }
}

bool GradientPipeline::occupies(const torch::Tensor& t, const torch::Tensor& slot) {
  return t.defined() && t.layout() == torch::kStrided && t.data_ptr() == slot.data_ptr() &&
         t.sizes() == slot.sizes() && t.is_contiguous();
}

void GradientPipeline::to_dense(const torch::Tensor& target, const torch::Tensor& grad) {
  if (grad.is_sparse()) {
    target.zero_();
    target.add_(grad);  // converts the dtype, sums duplicate indices
  } else {
    target.copy_(grad);
  }
}

void GradientPipeline::write_back(torch::Tensor& grad, const torch::Tensor& result) {
  if (grad.is_sparse()) {
    grad = result.to(grad.scalar_type()).to_sparse(grad.sparse_dim());
  } else {
    grad.copy_(result);
  }
}

void GradientPipeline::pack(int b, const torch::Tensor& flat, AfterPack after) {
  torch::NoGradGuard no_grad;
  for (int index : buckets[b].params) {
    GradParam& p = params[index];
    torch::Tensor target = slot(flat, index);
    const torch::Tensor& grad = p.param.grad();
    if (grad.defined() && grad.is_sparse() && after == AfterPack::kView) {
      throw ContractError(options_.op + ": the gradient of '" + shown(p) +
                          "' is sparse (an embedding with sparse=true?), and gradients as "
                          "bucket views must be dense; turn gradient_as_bucket_view off or "
                          "make the embedding dense");
    }
    if (!occupies(grad, target)) {
      if (grad.defined()) {
        to_dense(target, grad);
        count_copy(target.nbytes());
      } else {
        target.zero_();
        ++stats_.zero_filled;
      }
    }
    if (after == AfterPack::kView) {
      if (!occupies(p.param.grad(), target)) p.param.mutable_grad() = grad_slot(flat, index);
    } else if (after == AfterPack::kRelease) {
      p.param.mutable_grad() = torch::Tensor();
    }
  }
}

void GradientPipeline::unpack(int b, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  for (int index : buckets[b].params) {
    GradParam& p = params[index];
    torch::Tensor source = slot(flat, index);
    if (occupies(p.param.grad(), source)) continue;
    write_back(p.param.mutable_grad(), source);
    count_copy(source.nbytes());
  }
}

torch::Tensor GradientPipeline::gradient_or_zeros(int i, bool store) {
  GradParam& p = params[i];
  torch::Tensor grad = p.param.grad();
  if (grad.defined()) return grad;
  grad = torch::zeros_like(p.param, at::MemoryFormat::Contiguous);
  if (store) p.param.mutable_grad() = grad;
  ++stats_.zero_filled;
  return grad;
}

// --- Hooks ---------------------------------------------------------------------

// A gradient that arrives once its pass count is complete would be added into
// a buffer whose exchange is running or queued: refuse it before
// AccumulateGrad touches .grad().
void GradientPipeline::before_accumulate(size_t index) {
  std::lock_guard<std::mutex> lock(mutex);
  const GradParam& p = params[index];
  const int k = options_.backward_passes_per_step;
  if (p.passes < k) return;
  throw ContractError(
      options_.op + ": the gradient of '" + shown(p) + "' was computed again after its " +
      options_.exchange + " was started or queued: more than backward_passes_per_step (" +
      std::to_string(k) + ") backward passes before step(). " + options_.too_many_passes);
}

void GradientPipeline::after_accumulate(size_t index) {
  std::lock_guard<std::mutex> lock(mutex);
  exchanged_ = false;
  GradParam& p = params[index];
  if (++p.passes < options_.backward_passes_per_step) return;
  order_.push_back(static_cast<int>(index));
  GradBucket& bucket = buckets[p.bucket];
  if (++bucket.ready < static_cast<int>(bucket.params.size()) || bucket.launched ||
      !options_.launch_in_backward) {
    return;
  }
  torch::NoGradGuard no_grad;
  launch(p.bucket, /*in_backward=*/true);
}

// --- The step ------------------------------------------------------------------

void GradientPipeline::launch(int b, bool in_backward) {
  GradBucket& bucket = buckets[b];
  bucket.launched = true;
  bucket.launch_seq = ++launches_;
  (in_backward ? stats_.hook_launched : stats_.finish_launched) += bucket.params.size();
  try {
    policy_.launch(b, in_backward);
  } catch (...) {
    if (!bucket.error) bucket.error = std::current_exception();
    throw;
  }
}

void GradientPipeline::complete(int b) {
  GradBucket& bucket = buckets[b];
  if (bucket.done) return;
  for (const Handle& handle : bucket.work) {
    try {
      handle.wait(options_.timeout);
    } catch (...) {
      if (!bucket.error) bucket.error = std::current_exception();
    }
  }
  bucket.done = true;
  try {
    policy_.finished(b, bucket.error == nullptr);
  } catch (...) {
    if (!bucket.error) bucket.error = std::current_exception();
  }
}

void GradientPipeline::wait_for_others(int keep) {
  for (;;) {
    GradBucket* oldest = nullptr;
    for (size_t b = 0; b < buckets.size(); ++b) {
      GradBucket& bucket = buckets[b];
      if (!bucket.launched || bucket.done || static_cast<int>(b) == keep) continue;
      bool finished = true;
      for (const Handle& handle : bucket.work) finished = finished && handle.poll();
      if (finished) {
        complete(static_cast<int>(b));
      } else if (oldest == nullptr || bucket.launch_seq < oldest->launch_seq) {
        oldest = &bucket;
      }
    }
    if (oldest == nullptr) return;
    complete(static_cast<int>(oldest - buckets.data()));
  }
}

void GradientPipeline::finish(size_t max_in_flight) {
  std::lock_guard<std::mutex> lock(mutex);
  torch::NoGradGuard no_grad;
  std::exception_ptr error;
  // Launched inside backward, oldest first; then the rest, last bucket first.
  std::vector<int> launched;
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (buckets[b].launched && !buckets[b].done) launched.push_back(static_cast<int>(b));
  }
  if (!options_.complete_in_bucket_order) {
    std::sort(launched.begin(), launched.end(),
              [&](int x, int y) { return buckets[x].launch_seq < buckets[y].launch_seq; });
  }
  std::deque<int> running(launched.begin(), launched.end());
  for (size_t b = buckets.size(); b-- > 0;) {
    if (buckets[b].launched) continue;
    try {
      launch(static_cast<int>(b), /*in_backward=*/false);
    } catch (...) {
      // Kept in the bucket; what it started is still waited for below.
    }
    running.push_back(static_cast<int>(b));
    while (running.size() > std::max<size_t>(1, max_in_flight)) {
      complete(running.front());
      running.pop_front();
    }
  }
  if (options_.complete_in_bucket_order) std::sort(running.begin(), running.end());
  while (!running.empty()) {
    complete(running.front());
    running.pop_front();
  }
  for (const GradBucket& bucket : buckets) {
    if (!error && bucket.error) error = bucket.error;
  }
  reset();
  if (error) std::rethrow_exception(error);
  exchanged_ = true;
  ++stats_.exchanges;
}

void GradientPipeline::reset() {
  for (GradBucket& bucket : buckets) {
    bucket.ready = 0;
    bucket.launched = false;
    bucket.done = false;
    bucket.work.clear();
    bucket.error = nullptr;
  }
  for (GradParam& p : params) p.passes = 0;
  order_.clear();
}

bool GradientPipeline::exchanged() const {
  std::lock_guard<std::mutex> lock(mutex);
  return exchanged_;
}

void GradientPipeline::clear_exchanged() {
  std::lock_guard<std::mutex> lock(mutex);
  exchanged_ = false;
}

bool GradientPipeline::in_flight() const {
  for (const GradBucket& bucket : buckets) {
    if (bucket.launched) return true;
  }
  return false;
}

std::string GradientPipeline::describe(const GradBucket& bucket) const {
  if (bucket.params.size() == 1) return "'" + shown(params[bucket.params.front()]) + "'";
  return "bucket " + bucket.name + " ('" + shown(params[bucket.params.front()]) + "' ... '" +
         shown(params[bucket.params.back()]) + "', " + std::to_string(bucket.params.size()) +
         " gradients)";
}

void GradientPipeline::restart(const std::string& call) {
  std::lock_guard<std::mutex> lock(mutex);
  for (const GradBucket& bucket : buckets) {
    if (!bucket.launched) continue;
    throw ContractError(options_.op + "::" + call + ": called after backward() started the " +
                        options_.exchange + " of " + describe(bucket) +
                        " but before step() or synchronize() waited for it (it still writes "
                        "into the gradients); call step() or synchronize() first");
  }
  // A gradient final for this step but queued in an incomplete bucket (a
  // parameter unused on this rank keeps its bucket open until step()).
  if (!order_.empty()) {
    throw ContractError(options_.op + "::" + call + ": called after backward() completed the " +
                        "gradient of '" + shown(params[order_.front()]) +
                        "' (queued in a bucket for its " + options_.exchange +
                        ") but before step() or synchronize(); call step() or synchronize() "
                        "first");
  }
  reset();
  exchanged_ = false;
}

std::vector<int> GradientPipeline::order() const {
  std::lock_guard<std::mutex> lock(mutex);
  return order_;
}

PipelineStats GradientPipeline::stats() const {
  std::lock_guard<std::mutex> lock(mutex);
  return stats_;
}

}  // namespace kolo::detail
