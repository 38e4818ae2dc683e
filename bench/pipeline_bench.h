// `kolo-bench pipeline`: pipeline parallelism measured, and what splitting a
// model buys in memory.
//
// 1. Bubble and throughput. A model of --blocks MLP blocks, each
//    Linear(hidden, ffn), GELU, Linear(ffn, hidden) (evenly heavy: the
//    partition by parameter count gives every stage the same number of
//    blocks), trained with Adam on a global batch of --batch rows, for each
//    schedule (gpipe, 1f1b), each stage count p (--stages) and each
//    micro-batch count m (--micro-batches). Per stage, the measured bubble is
//    its idle time over its step time (Pipeline::stats(): 1 - busy / step,
//    summed over the timed steps); the row gives the mean over the stages,
//    the theory (p - 1) / (m + p - 1), samples/sec (the batch over the
//    slowest stage's mean step time) and the largest peak activation bytes of
//    any stage. The same model on one rank and data parallel on 2 ranks
//    (DistributedOptimizer, --batch / 2 rows each) gives the throughput table.
// 2. Memory (--memory-limit-mib > 0). A bigger model of the same blocks
//    (--memory-blocks, --memory-hidden, --memory-ffn) unsplit on one rank,
//    with pp = 2 and with tp = 2 (each block a ColumnParallelLinear, GELU,
//    RowParallelLinear over the 2 ranks), all three through a Pipeline (one
//    stage unsplit and per tensor slice) with 1F1B on --memory-micro-batches
//    micro-batches, so that the activations are counted by the same rule.
//    The bench's own accounting per rank: parameters + gradients + Adam state
//    + peak activation bytes (not the machine's memory). A rank stops
//    training the first time its accounting exceeds the limit; the row says
//    whether each layout fits, with the peak of the largest rank.
//
// 3. Against PyTorch (--no-torch leaves it out): the bubble model's
//    configurations on PyTorch's own schedules (torch.distributed.pipelining's
//    ScheduleGPipe and Schedule1F1B, gloo, one rank per stage, started by the
//    real torchrun of --python: bench/pipeline_worker_torch.py), samples/sec
//    of each beside kolo's at the same stages and micro-batches.
//
// The driver is a plain process. Every configuration runs in fresh worker
// processes under kolorun (`kolo-bench pipeline --worker ...`), one rank per
// stage, 1 torch thread each, so the stages really run in parallel on
// separate cores. Each worker prints one JSON row per configuration it ran.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolo::bench {

// The model and training loop of one worker run.
struct PipelineModelOptions {
  int blocks = 8;
  int hidden = 512;
  int ffn = 2048;
  int batch = 128;  // global rows per step
  int steps = 5;    // timed
  int warmup_steps = 1;
  int threads = 1;  // torch threads per worker
};

struct PipelineBenchOptions {
  PipelineModelOptions model;
  std::vector<std::string> schedules = {"gpipe", "1f1b"};
  std::vector<int> stages = {2};
  std::vector<int> micro_batches = {1, 2, 4, 8, 16};
  bool compare_dp = true;     // the throughput table (1 rank, dp = 2)
  bool compare_torch = true;  // the table against torch.distributed.pipelining
  std::string python;         // its interpreter; "" = the build's (KOLO_PYTHON)
  // Memory table; 0 = skip it.
  int64_t memory_limit_mib = 320;
  PipelineModelOptions memory_model{4, 1024, 4096, 32, 2, 1, 1};
  int memory_micro_batches = 4;
  int config_timeout_s = 900;
  bool json = false;
  // Markdown files whose `pipeline` section is rewritten with the tables
  // (docs/benchmarks.md, docs/parallelism.md).
  std::vector<std::string> docs_path;
  std::string kolorun;  // "" = <build>/launcher/kolorun
  std::string command_line;
};

// One worker run: `layout` is
//   "pp"     the world size is the stage count; one row per schedule and m;
//   "dp"     every rank the whole model on batch / world rows, gradients
//            averaged by DistributedOptimizer;
//   "single" the whole model on one rank;
//   "tp"     each block split over the world's ranks (tensor parallel).
// dp, single and tp run a one-stage Pipeline on each rank (m micro-batches
// are gradient accumulation there).
struct PipelineWorkerOptions {
  PipelineModelOptions model;
  std::string layout = "pp";
  std::vector<std::string> schedules = {"1f1b"};
  std::vector<int> micro_batches = {1};
  int64_t memory_limit_bytes = 0;  // 0 = no limit
};

int run_pipeline_bench(const PipelineBenchOptions& options);
int run_pipeline_worker(const PipelineWorkerOptions& options);

}  // namespace kolo::bench
