// What LARS and LAMB share (kolo/torch/layerwise.h): the layout of layers
// over the parameters stepped, per-layer norms with one reduction per step,
// and the large-batch recipe's exclusion rule.
#include "kolo/torch/layerwise.h"

#include <cmath>
#include <typeinfo>

#include "kolo/core/errors.h"
#include "kolo/torch/compat.h"

namespace kolo {

void LayerwiseOptimizer::set_layout(LayerLayout layout) {
  const std::string op = "kolo::LayerwiseOptimizer::set_layout";
  if (!layout.reduce_sum) throw ContractError(op + ": the layout has no reduce_sum function");
  if (layout.runs.size() != param_groups_.size()) {
    throw ContractError(op + ": the layout has runs for " + std::to_string(layout.runs.size()) +
                        " parameter groups, the optimizer has " +
                        std::to_string(param_groups_.size()));
  }
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    if (layout.runs[g].size() != params.size()) {
      throw ContractError(op + ": parameter group " + std::to_string(g) + " has " +
                          std::to_string(params.size()) + " parameters, the layout " +
                          std::to_string(layout.runs[g].size()));
    }
    for (size_t j = 0; j < params.size(); ++j) {
      int64_t next = 0;
      for (const LayerRun& run : layout.runs[g][j]) {
        if (run.begin != next || run.numel <= 0 || run.layer < 0 || run.layer >= layout.layers) {
          throw ContractError(op + ": the runs of parameter " + std::to_string(j) + " of group " +
                              std::to_string(g) + " do not cover it in order (run of layer " +
                              std::to_string(run.layer) + " at " + std::to_string(run.begin) +
                              ", " + std::to_string(run.numel) + " elements; expected a start at " +
                              std::to_string(next) + " and a layer below " +
                              std::to_string(layout.layers) + ")");
        }
        next += run.numel;
      }
      if (next != params[j].numel()) {
        throw ContractError(op + ": the runs of parameter " + std::to_string(j) + " of group " +
                            std::to_string(g) + " cover " + std::to_string(next) + " of its " +
                            std::to_string(params[j].numel()) + " elements");
      }
    }
  }
  layout_ = std::make_unique<LayerLayout>(std::move(layout));
}

void LayerwiseOptimizer::clear_layout() { layout_.reset(); }

std::vector<LayerwiseOptimizer::Slot> LayerwiseOptimizer::slots() const {
  std::vector<Slot> out;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t j = 0; j < params.size(); ++j) {
      if (params[j].grad().defined()) out.push_back({g, j, params[j]});
    }
  }
  return out;
}

std::vector<LayerRun> LayerwiseOptimizer::runs_of(const Slot& slot) const {
  if (layout_) return layout_->runs[slot.group][slot.index];
  return {LayerRun{0, 0, slot.param.numel()}};
}

torch::Tensor LayerwiseOptimizer::elements(const torch::Tensor& t, const LayerRun& run,
                                           int64_t parameter_numel) {
  if (run.begin == 0 && run.numel == parameter_numel) return t;
  return t.view({-1}).narrow(0, run.begin, run.numel);
}

std::vector<std::vector<std::array<double, 2>>> LayerwiseOptimizer::layer_norms(
    const std::vector<Slot>& slots, const std::vector<torch::Tensor>& a,
    const std::vector<torch::Tensor>& b) {
  bool any_adapts = false;
  for (size_t g = 0; g < param_groups_.size(); ++g) any_adapts = any_adapts || group_adapts(g);

  std::vector<std::vector<std::array<double, 2>>> norms(slots.size());
  // Sums of squares per layer: (layers, 2) float64. Without a layout, slot i
  // is layer i.
  const int64_t layers = layout_ ? layout_->layers : static_cast<int64_t>(slots.size());
  torch::Tensor sums = torch::zeros({layers, 2}, torch::kDouble);
  auto acc = sums.accessor<double, 2>();
  std::vector<std::vector<int64_t>> layer_of(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& slot = slots[i];
    const std::vector<LayerRun> runs = runs_of(slot);
    for (const LayerRun& run : runs) {
      const int64_t layer = layout_ ? run.layer : static_cast<int64_t>(i);
      layer_of[i].push_back(layer);
      if (!group_adapts(slot.group)) continue;
      const int64_t n = slot.param.numel();
      const torch::Tensor x = elements(a[i], run, n).to(torch::kDouble);
      const torch::Tensor y = elements(b[i], run, n).to(torch::kDouble);
      acc[layer][0] += x.square().sum().item<double>();
      acc[layer][1] += y.square().sum().item<double>();
    }
  }
  if (layout_ && any_adapts) {
    layout_->reduce_sum(sums);
    ++reductions_;
  }
  acc = sums.accessor<double, 2>();
  for (size_t i = 0; i < slots.size(); ++i) {
    for (int64_t layer : layer_of[i]) {
      norms[i].push_back({std::sqrt(acc[layer][0]), std::sqrt(acc[layer][1])});
    }
  }
  return norms;
}

LayerwiseOptimizer::LayerwiseOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                       std::unique_ptr<torch::optim::OptimizerOptions> defaults)
    : torch::optim::Optimizer(param_groups, std::move(defaults)) {
  compat::keep_group_options(*this, param_groups);
}

void LayerwiseOptimizer::throw_wrong_options(const std::string& op, size_t group) const {
  throw ContractError(op + ": parameter group " + std::to_string(group) + " has options of type " +
                      typeid(param_groups_[group].options()).name() +
                      "; give every group this optimizer's options (or none, for the defaults)");
}

void step_locally(torch::optim::Optimizer& optimizer) {
  auto* layerwise = dynamic_cast<LayerwiseOptimizer*>(&optimizer);
  if (layerwise == nullptr || !layerwise->has_layout()) {
    optimizer.step();
    return;
  }
  const LayerLayout layout = *layerwise->layout();
  layerwise->clear_layout();
  try {
    optimizer.step();
  } catch (...) {
    layerwise->set_layout(layout);
    throw;
  }
  layerwise->set_layout(layout);
}

bool excluded_from_adaptation(const std::string& name, const torch::Tensor& parameter) {
  if (parameter.dim() < 2) return true;
  const size_t dot = name.rfind('.');
  const std::string last = dot == std::string::npos ? name : name.substr(dot + 1);
  return last == "bias";
}

}  // namespace kolo
