// ParallelGrid: the ranks of a job arranged as data parallel x pipeline x
// tensor parallel (dp x pp x tp = world size), with the engine process sets
// each dimension needs, from one call:
//
//   kolo::ParallelGrid grid{/*dp=*/2, /*pp=*/2, /*tp=*/1};
//   grid.pp_ranks();   // this rank's pipeline: world ranks in stage order
//   grid.dp_set();     // process set of this rank's data-parallel replicas
//   grid.tp_set();     // process set of this rank's tensor-parallel group
//
// Layout (Megatron-LM's): world rank = (pp_rank * dp + dp_rank) * tp + tp_rank,
// so a tensor-parallel group is tp consecutive ranks (on one host when it
// fits), a pipeline's stages are dp * tp ranks apart, and the data-parallel
// replicas of one stage and tensor slice are tp ranks apart.
//
// Collective over the engine's world: every rank creates the process set of
// every data-parallel and every tensor-parallel group, in the same order
// (Engine::add_process_set's rule). A group that is the whole world uses set
// 0; a group of one rank gets a set of its own, so code that reduces over it
// runs unchanged. The pipeline dimension needs no set: stages talk with
// point-to-point transfers on the world's ranks.
#pragma once

#include <string>
#include <vector>

#pragma GCC visibility push(default)

namespace kolo {

class Engine;

struct ParallelGridOptions {
  Engine* engine = nullptr;  // nullptr = kolo::runtime().engine()
};

class ParallelGrid {
 public:
  // ContractError unless dp, pp, tp >= 1 and dp * pp * tp == the engine's size.
  ParallelGrid(int dp, int pp, int tp = 1, const ParallelGridOptions& options = {});

  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int rank() const { return rank_; }  // world rank
  int dp_rank() const { return dp_rank_; }
  int pp_rank() const { return pp_rank_; }
  int tp_rank() const { return tp_rank_; }

  // World rank of the given coordinates.
  int rank_of(int dp_rank, int pp_rank, int tp_rank) const;
  // This rank's groups as world ranks: replicas (sorted), stages (in stage
  // order, which is also sorted), tensor slices (sorted).
  std::vector<int> dp_ranks() const;
  std::vector<int> pp_ranks() const;
  std::vector<int> tp_ranks() const;
  // Engine process sets of this rank's data-parallel and tensor-parallel groups.
  int dp_set() const { return dp_set_; }
  int tp_set() const { return tp_set_; }
  Engine& engine() const { return *engine_; }

  // "dp=2 pp=2 tp=1"
  std::string describe() const;

 private:
  Engine* engine_;
  int dp_, pp_, tp_;
  int rank_, dp_rank_, pp_rank_, tp_rank_;
  int dp_set_ = 0, tp_set_ = 0;
};

}  // namespace kolo

#pragma GCC visibility pop
