// Layer-wise adaptive optimizers for large batches: what kolo::LARS
// (lars.h) and kolo::LAMB (lamb.h) share, and the parameter groups of the
// large-batch recipe. See docs/large_batch.md.
//
// A layer-wise optimizer scales the update of each parameter tensor (a
// "layer": fc1.weight, conv2.weight...) by a trust ratio computed from
// norms over the whole tensor: ||w|| / ||g|| for LARS, ||w|| / ||update||
// for LAMB. So every layer moves by about the same fraction of its weights
// per step whatever the size of its gradients, which is what lets the
// learning rate, and with it the batch, grow large (You et al. 2017, 2019).
//
// Parameter groups. Each group's options say whether its parameters are
// adapted (`adapt`, default true) and their weight decay. The recipe
// (You et al.; Goyal et al. for weight decay) excludes biases and
// normalisation parameters from both: layerwise_param_groups() below makes
// the two groups from a model's named parameters.
//
// State. Per-parameter state (LARS's momentum buffer; LAMB's step and
// moments) and group options serialise through Optimizer::save/load as
// libtorch's optimizers do, so kolo::save_checkpoint, broadcast_optimizer_state,
// elastic commits and ZeRO's sharded checkpoints carry them unchanged.
//
// Sharding (ZeroOptimizer). Under ZeRO the parameters this optimizer steps
// are 1-D pieces of this rank's slices, and a piece may hold the end of one
// layer and the start of the next while the rest of each layer lives on
// other ranks. The sharding wrapper then calls set_layout(): which runs of
// which layers each piece holds, and a function that sums a small float64
// tensor over the ranks. A step computes every layer's partial sums of
// squares from the runs this rank holds, reduces them for all layers at
// once (one collective per step, whatever the number of layers), and applies
// each layer's trust ratio to its runs: the result equals the unsharded
// optimizer's up to float rounding of the sums. Without a layout (alone, or
// under DistributedOptimizer, which hands every rank whole averaged
// gradients) each parameter is one layer and nothing is communicated.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// A run of consecutive elements of one layer inside one parameter of the
// optimizer (flattened, row-major).
struct LayerRun {
  int64_t layer = 0;  // in [0, LayerLayout::layers)
  int64_t begin = 0;  // first element within the optimizer's parameter
  int64_t numel = 0;
};

struct LayerLayout {
  int64_t layers = 0;  // whole tensors, numbered the same on every rank
  // runs[g][j]: the runs of parameter j of parameter group g, in element
  // order, together covering every element of it.
  std::vector<std::vector<std::vector<LayerRun>>> runs;
  // Sums `sums` ((layers, 2) float64, contiguous) element-wise over every
  // rank of the sharded optimizer, in place: one collective. Every rank
  // calls it once per step() that adapts any group, in the same order.
  std::function<void(torch::Tensor& sums)> reduce_sum;
};

class LayerwiseOptimizer : public torch::optim::Optimizer {
 public:
  // Called by a sharding wrapper after it rewrote the parameter groups.
  // ContractError if the runs do not match the groups (count of groups and
  // parameters, runs covering each parameter in order, layers in range) or
  // reduce_sum is empty.
  void set_layout(LayerLayout layout);
  // Back to one layer per parameter, nothing communicated.
  void clear_layout();
  bool has_layout() const { return layout_ != nullptr; }
  const LayerLayout* layout() const { return layout_.get(); }

  // Collectives issued by step() through the layout's reduce_sum since
  // construction (at most one per step).
  int64_t reductions() const { return reductions_; }

 protected:
  // Each group keeps its own options (compat::keep_group_options says why).
  LayerwiseOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     std::unique_ptr<torch::optim::OptimizerOptions> defaults);

  // A parameter being stepped (its gradient is defined).
  struct Slot {
    size_t group = 0;
    size_t index = 0;  // in the group
    torch::Tensor param;
  };
  std::vector<Slot> slots() const;

  // Whether parameter group g adapts (its options' `adapt`); the same on
  // every rank, so every rank reduces or none does.
  virtual bool group_adapts(size_t group) const = 0;

  // The runs of a slot: its layout runs, or one run covering it.
  std::vector<LayerRun> runs_of(const Slot& slot) const;
  // The elements of `run` in `t` (a tensor shaped like the slot's
  // parameter): `t` itself when the run covers it, else a 1-D view.
  static torch::Tensor elements(const torch::Tensor& t, const LayerRun& run,
                                int64_t parameter_numel);

  // L2 norms over whole layers of two tensors per slot: result[i][r] =
  // {||a||, ||b||} over the layer of run r of slots[i]. a[i] and b[i] are
  // shaped like slots[i].param; slots of groups that do not adapt are not
  // read (pass undefined tensors) and get {0, 0}. With a layout: partial
  // sums from this rank's runs, reduced in one collective if any group
  // adapts.
  std::vector<std::vector<std::array<double, 2>>> layer_norms(const std::vector<Slot>& slots,
                                                              const std::vector<torch::Tensor>& a,
                                                              const std::vector<torch::Tensor>& b);

  // Throws ContractError naming `op` when a group's options are not of type
  // Options (a group added with another optimizer's options).
  template <typename Options>
  void check_group_options(const std::string& op) const {
    for (size_t g = 0; g < param_groups_.size(); ++g) {
      if (dynamic_cast<const Options*>(&param_groups_[g].options()) == nullptr) {
        throw_wrong_options(op, g);
      }
    }
  }

 private:
  [[noreturn]] void throw_wrong_options(const std::string& op, size_t group) const;

  std::unique_ptr<LayerLayout> layout_;
  int64_t reductions_ = 0;
};

// optimizer.step(), except that a LayerwiseOptimizer with a layout steps
// without its cross-rank reduction (each run's norms from this rank's
// elements alone). For a step whose result is discarded and that not every
// rank takes: a sharded checkpoint creates the state it then overwrites so.
void step_locally(torch::optim::Optimizer& optimizer);

// The recipe's rule: biases and normalisation parameters (BatchNorm,
// LayerNorm, GroupNorm scales and shifts) take neither weight decay nor
// layer-wise adaptation. A parameter is excluded when it has fewer than two
// dimensions or its name's last component is "bias".
bool excluded_from_adaptation(const std::string& name, const torch::Tensor& parameter);

// Two parameter groups from a model's named parameters: the adapted ones
// with `options`, and the excluded ones (excluded_from_adaptation) with
// `options` but weight_decay 0 and adapt false. A group left empty is
// omitted. Options is LARSOptions or LAMBOptions.
//
//   kolo::LAMB lamb(kolo::layerwise_param_groups(model->named_parameters(),
//                                                kolo::LAMBOptions(1e-2).weight_decay(0.01)));
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> layerwise_param_groups(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    const Options& options) {
  std::vector<torch::Tensor> adapted;
  std::vector<torch::Tensor> excluded;
  for (const auto& item : named_parameters) {
    (excluded_from_adaptation(item.key(), item.value()) ? excluded : adapted)
        .push_back(item.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!adapted.empty()) {
    groups.emplace_back(std::move(adapted), std::make_unique<Options>(options));
  }
  if (!excluded.empty()) {
    Options plain = options;
    plain.weight_decay(0).adapt(false);
    groups.emplace_back(std::move(excluded), std::make_unique<Options>(plain));
  }
  return groups;
}

}  // namespace kolo
#pragma GCC visibility pop
