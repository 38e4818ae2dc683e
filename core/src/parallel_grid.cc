// ParallelGrid (kolo/core/parallel_grid.h).
#include "kolo/core/parallel_grid.h"

#include "kolo/core/engine.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"

namespace kolo {

ParallelGrid::ParallelGrid(int dp, int pp, int tp, const ParallelGridOptions& options)
    : engine_(options.engine != nullptr ? options.engine : &kolo::runtime().engine()),
      dp_(dp),
      pp_(pp),
      tp_(tp) {
  const int world = engine_->size();
  if (dp < 1 || pp < 1 || tp < 1 || static_cast<long long>(dp) * pp * tp != world) {
    throw ContractError("kolo::ParallelGrid: dp=" + std::to_string(dp) + " x pp=" +
                        std::to_string(pp) + " x tp=" + std::to_string(tp) + " must equal the " +
                        std::to_string(world) + " ranks of the world (each >= 1)");
  }
  rank_ = engine_->rank();
  tp_rank_ = rank_ % tp;
  dp_rank_ = (rank_ / tp) % dp;
  pp_rank_ = rank_ / (tp * dp);
  // Every rank creates every group's set, in one order: data-parallel groups
  // by (pp_rank, tp_rank), then tensor-parallel groups by (pp_rank, dp_rank).
  for (int p = 0; p < pp; ++p) {
    for (int t = 0; t < tp; ++t) {
      std::vector<int> group;
      for (int d = 0; d < dp; ++d) group.push_back(rank_of(d, p, t));
      const int set = dp == world ? 0 : engine_->add_process_set(group).id();
      if (p == pp_rank_ && t == tp_rank_) dp_set_ = set;
    }
  }
  for (int p = 0; p < pp; ++p) {
    for (int d = 0; d < dp; ++d) {
      std::vector<int> group;
      for (int t = 0; t < tp; ++t) group.push_back(rank_of(d, p, t));
      const int set = tp == world ? 0 : engine_->add_process_set(group).id();
      if (p == pp_rank_ && d == dp_rank_) tp_set_ = set;
    }
  }
}

int ParallelGrid::rank_of(int dp_rank, int pp_rank, int tp_rank) const {
  if (dp_rank < 0 || dp_rank >= dp_ || pp_rank < 0 || pp_rank >= pp_ || tp_rank < 0 ||
      tp_rank >= tp_) {
    throw ContractError("kolo::ParallelGrid::rank_of: (dp " + std::to_string(dp_rank) + ", pp " +
                        std::to_string(pp_rank) + ", tp " + std::to_string(tp_rank) +
                        ") is outside the grid " + describe());
  }
  return (pp_rank * dp_ + dp_rank) * tp_ + tp_rank;
}

std::vector<int> ParallelGrid::dp_ranks() const {
  std::vector<int> ranks;
  for (int d = 0; d < dp_; ++d) ranks.push_back(rank_of(d, pp_rank_, tp_rank_));
  return ranks;
}

std::vector<int> ParallelGrid::pp_ranks() const {
  std::vector<int> ranks;
  for (int p = 0; p < pp_; ++p) ranks.push_back(rank_of(dp_rank_, p, tp_rank_));
  return ranks;
}

std::vector<int> ParallelGrid::tp_ranks() const {
  std::vector<int> ranks;
  for (int t = 0; t < tp_; ++t) ranks.push_back(rank_of(dp_rank_, pp_rank_, t));
  return ranks;
}

std::string ParallelGrid::describe() const {
  return "dp=" + std::to_string(dp_) + " pp=" + std::to_string(pp_) + " tp=" + std::to_string(tp_);
}

}  // namespace kolo
