// A parameter server's shard on disk (internal; PsOptions::checkpoint_dir,
// resume_from; docs/strategies.md, "Server checkpoints").
//
// Server s of S writes <dir>/ps-shard-<s>-of-<S>-step-<N>.kolo for its save
// at step N: a kolo checkpoint
// (kolo/torch/checkpoint.h: the checksummed container and its payload, with
// the shard's slices as the model's parameters "s0", "s1", ... and the
// server's optimizer) whose CheckpointState holds the save: step = the save
// id (the step every worker continues at), extras "ps/..." = the server's
// index, the server count, the model's fingerprint, the mode and the save
// period ("ps/every": a job that resumes and saves keeps it). Every shard
// of one save carries the same step; a worker greeting servers that resumed
// from different steps refuses them (a mix of two saves).
//
// Two phases without a coordinator (the servers do not talk to each other):
// a save writes a new file beside this server's earlier ones, so a save that
// fails on one server (a full disk) overwrites nothing; a save at step N is
// complete once every server's shard of step N is in the directory, and
// resuming takes the newest complete one. Each server keeps its newest
// kKeptSaves saves: a server is never more than one save ahead of a server
// whose save failed (the next one needs the pushes the failed server stopped
// taking), so with 3 the older of the two saves a failed server holds is
// still complete on every server. A directory holding this server's shards
// alone (one directory per host) resumes from its newest save; the workers
// refuse a mix.
//
// Sparse tables (kolo/torch/ps_embedding.h) are in the same file: table t's
// rows and row-wise optimizer state as buffers "t<t>_weight", "t<t>_state1",
// ... and extras "ps/tables" (their count) and "ps/table<t>" (what the table
// is: name, rows, dim, optimizer), checked on resume.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kolo/core/parameter_server.h"

namespace torch::optim {
class Optimizer;
}

namespace kolo::ps::detail {

struct ShardIdentity {
  int server = 0;
  int servers = 1;
  int64_t fingerprint = 0;  // of the model's specs
  Mode mode = Mode::kSync;
  int64_t every = 0;  // PsOptions::checkpoint_every (0: this job does not save)
};

// One sparse table's part of a shard: what it is (compared on resume) and
// its tensors by name (the rows and the optimizer state; loading writes into
// them in place).
struct ShardTable {
  std::string identity;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
};

// What a shard holds besides the optimizer.
struct ShardTensors {
  std::vector<torch::Tensor> slices;  // the dense slices (1-D leaves)
  std::vector<ShardTable> tables;
};

// How many saves each server keeps (see above).
constexpr size_t kKeptSaves = 3;

std::string shard_path(const std::string& dir, int server, int servers, int64_t step);

// Writes the shard saved at `step` (atomically) beside this server's earlier
// saves, then removes the ones older than its newest kKeptSaves.
void save_shard(const std::string& dir, const ShardIdentity& who, int64_t step,
                const ShardTensors& tensors, const torch::optim::Optimizer& optimizer);

// The step of the save this server resumes from in `dir`: the newest save
// every server of the job has a shard of, or, when `dir` holds no other
// server's shard of this server count, this server's newest. ContractError
// naming what is there when there is none (no shard of this server, another
// server count's shards, saves no step of which is complete).
int64_t resume_step(const std::string& dir, const ShardIdentity& who);

// Loads this server's shard of resume_step(dir) into the tensors (in place)
// and the optimizer; returns that step. ContractError naming the file when it
// is damaged, or saved by another model, server or set of tables (a save in
// another mode resumes: its state is the same). Then removes this server's
// shards of newer steps (saves that never completed).
int64_t load_shard(const std::string& dir, const ShardIdentity& who, const ShardTensors& tensors,
                   torch::optim::Optimizer& optimizer);

}  // namespace kolo::ps::detail
