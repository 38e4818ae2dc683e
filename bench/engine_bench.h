// `kolo-bench engine`: what the engine's negotiation and fusion cost. Two
// gradient sets, each submitted as a training step would (every tensor
// allreduce_async'ed, then all waited): a ResNet-50-like set (its 161
// parameter tensors with their real shapes, 25.6M floats, submitted in reverse
// order as backward produces them) and a small-tensor set (1000 x 4 KiB). Each
// is timed with fusion on (the engine's default threshold), fusion off
// (threshold 0), and as one allreduce of a single buffer of the same total
// bytes on a raw communicator, the floor the engine is compared with.
#pragma once

#include <string>
#include <vector>

#include "timing.h"

namespace kolo::bench {

struct EngineBenchOptions {
  std::vector<std::string> workloads = {"resnet50", "small"};
  int small_tensors = 1000;
  size_t small_tensor_bytes = 4096;
  bool json = false;         // one JSON object per row on stdout (rank 0)
  std::string docs_path;     // when set, rank 0 rewrites the engine section of this file
  std::string command_line;  // recorded in the docs section
  // When set, rank 0 records a timeline of a few extra (untimed) steps of each
  // workload with fusion on, after the measurements.
  std::string timeline_path;
  int timeline_steps = 3;
  TimingOptions timing;  // per round; rep_ms is ignored: one step per repetition
  int rounds = 3;        // the modes take turns this many times; the median round counts
};

// Runs inside a worker started by kolorun or mpirun (calls kolo::init itself).
int run_engine_bench(const EngineBenchOptions& options);

// One parameter tensor of the ResNet-50-like set.
struct ParamShape {
  std::string name;            // torchvision's name, e.g. "layer1.0.conv1.weight"
  std::vector<int64_t> shape;  // (out, in, kh, kw) for convs
};
// ResNet-50's 161 parameter tensors in forward order (25,557,032 floats).
std::vector<ParamShape> resnet50_parameters();

}  // namespace kolo::bench
