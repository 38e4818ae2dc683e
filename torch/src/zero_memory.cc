// Memory accounting of the ZeroOptimizer (kolo/torch/zero.h: ZeroMemory).
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <unordered_set>

#include "kolo/torch/lamb.h"
#include "kolo/torch/lars.h"
#include "kolo/torch/mixed_precision.h"
#include "zero_state.h"

namespace kolo {

namespace {

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

int64_t bytes_of(std::initializer_list<const torch::Tensor*> tensors) {
  int64_t total = 0;
  for (const torch::Tensor* t : tensors) total += bytes_of(*t);
  return total;
}

// Bytes of one parameter's state.
int64_t state_bytes(const torch::optim::OptimizerParamState* s) {
  using namespace torch::optim;
  int64_t total = 0;
  if (auto* m = dynamic_cast<const MasterParamState*>(s)) {
    // A MasterWeightOptimizer's: the float32 master copy and its optimizer state.
    total += bytes_of(m->master);
    if (m->inner) total += state_bytes(m->inner.get());
  } else if (auto* a = dynamic_cast<const AdamParamState*>(s)) {
    total += bytes_of({&a->exp_avg(), &a->exp_avg_sq(), &a->max_exp_avg_sq()});
  } else if (auto* w = dynamic_cast<const AdamWParamState*>(s)) {
    total += bytes_of({&w->exp_avg(), &w->exp_avg_sq(), &w->max_exp_avg_sq()});
  } else if (auto* g = dynamic_cast<const SGDParamState*>(s)) {
    total += bytes_of(g->momentum_buffer());
  } else if (auto* ada = dynamic_cast<const AdagradParamState*>(s)) {
    total += bytes_of(ada->sum());
  } else if (auto* r = dynamic_cast<const RMSpropParamState*>(s)) {
    total += bytes_of({&r->square_avg(), &r->momentum_buffer(), &r->grad_avg()});
  } else if (auto* lamb = dynamic_cast<const LAMBParamState*>(s)) {
    total += bytes_of({&lamb->exp_avg(), &lamb->exp_avg_sq()});
  } else if (auto* lars = dynamic_cast<const LARSParamState*>(s)) {
    total += bytes_of(lars->momentum_buffer());
  } else {
    // Another optimizer: the size of its serialised state (tensor bytes
    // plus a small archive overhead).
    torch::serialize::OutputArchive archive;
    s->serialize(archive);
    total += static_cast<int64_t>(detail::archive_to_bytes(archive).size());
  }
  return total;
}

}  // namespace

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (const auto& [key, state] : optimizer.state()) total += state_bytes(state.get());
  return total;
}

namespace detail {

namespace {

// Bytes of the distinct storages behind some tensors: views of one buffer
// (stage 1 and 2 parameters and their slice, stage 1 gradients and their
// reduced slice) count once, and a released stage-3 buffer counts 0.
class StorageBytes {
 public:
  void add(const torch::Tensor& t) {
    if (!t.defined()) return;
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    if (seen_.insert(storage).second) total_ += static_cast<int64_t>(storage->nbytes());
  }
  int64_t total() const { return total_; }

 private:
  std::unordered_set<const c10::StorageImpl*> seen_;
  int64_t total_ = 0;
};

}  // namespace

ZeroMemory ZeroState::current() const {
  StorageBytes param_bytes, grad_bytes;
  for (const ZeroParam& p : params) {
    param_bytes.add(p.param);
    grad_bytes.add(p.param.grad());
  }
  for (const ZeroBucket& b : buckets) {
    param_bytes.add(b.shard);
    for (const torch::Tensor* t : {&b.grad_shard, &b.flat_grad, &b.full_grad}) grad_bytes.add(*t);
  }
  ZeroMemory m;
  m.param_bytes = param_bytes.total();
  m.grad_bytes = grad_bytes.total();
  m.optimizer_state_bytes = optimizer_state_bytes(*optimizer);
  return m;
}

void ZeroState::sample() {
  const ZeroMemory m = current();
  peak.peak_param_bytes = std::max(peak.peak_param_bytes, m.param_bytes);
  peak.peak_grad_bytes = std::max(peak.peak_grad_bytes, m.grad_bytes);
  peak.peak_optimizer_state_bytes =
      std::max(peak.peak_optimizer_state_bytes, m.optimizer_state_bytes);
  peak.peak_total_bytes =
      std::max(peak.peak_total_bytes, m.param_bytes + m.grad_bytes + m.optimizer_state_bytes);
}

}  // namespace detail

ZeroMemory ZeroOptimizer::memory() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  ZeroMemory m = state_->current();
  const ZeroMemory& p = state_->peak;
  m.peak_param_bytes = std::max(p.peak_param_bytes, m.param_bytes);
  m.peak_grad_bytes = std::max(p.peak_grad_bytes, m.grad_bytes);
  m.peak_optimizer_state_bytes = std::max(p.peak_optimizer_state_bytes, m.optimizer_state_bytes);
  m.peak_total_bytes =
      std::max(p.peak_total_bytes, m.param_bytes + m.grad_bytes + m.optimizer_state_bytes);
  return m;
}

void ZeroOptimizer::reset_peak() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->peak = ZeroMemory{};
  state_->sample();
}

}  // namespace kolo
