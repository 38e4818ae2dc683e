// `kolo-bench zero`: memory and step time of sharded training. A stack of
// --layers Linear(--width, --width) layers (6 x 4096^2 = about 100 M
// parameters), each a kolo::ShardedUnit, trained with Adam at each world size
// and mode: `ddp` (kolo::DistributedOptimizer) and ZeRO stages `1`, `2`, `3`
// (kolo::ZeroOptimizer).
//
// The driver is a plain process. Each configuration runs in fresh worker
// processes started through kolorun (`kolo-bench zero --worker ...`), so the
// peak resident memory (VmHWM of /proc/self/status) belongs to that
// configuration alone. A worker trains --warmup-steps untimed steps (Adam
// creates its state in the first), then --steps timed steps, and prints one
// JSON object: the bytes of parameters, gradients and optimizer state it holds
// after the last step (ZeroOptimizer::memory(); for ddp counted from the
// model's tensors and the optimizer's state the same way), the accounting's
// peaks, VmHWM and the mean step time. The driver keeps, per configuration,
// the largest value over the ranks, and evaluates the targets on the
// rows (a second table: 1/N state and gradients, stage 3's peak parameters
// against 1/N + the largest unit, peak RSS falling, step time at 2 workers).
// Stage 3 runs twice: with prefetch (the default, which holds the next unit
// while one runs) and without (the bound of one unit applies there).
//
// The peer, mode `fsdp2`: PyTorch's FSDP2 (torch.distributed.fsdp.fully_shard,
// gloo) on the same model, data and loop, each Linear one unit, started by
// the real torchrun of --python (bench/zero_worker_fsdp2.py); its rows carry
// the same fields. Against it: stage 3's step time and its memory (the bytes
// held after the step, and peak RSS above the resident set before the model
// was built, which leaves out each runtime's own start-up memory).
#pragma once

#include <string>
#include <vector>

namespace kolo::bench {

struct ZeroBenchOptions {
  std::vector<std::string> modes = {"ddp", "1", "2", "3", "fsdp2"};
  std::vector<int> workers = {1, 2, 4};
  int layers = 6;
  int width = 4096;
  int batch = 8;  // rows per worker per step
  int steps = 3;
  int warmup_steps = 1;
  int config_timeout_s = 900;
  bool json = false;
  std::string docs_path;
  std::string kolorun;  // "" = <build>/launcher/kolorun next to this binary's directory
  std::string python;   // fsdp2's interpreter; "" = the build's (KOLO_PYTHON)
  std::string command_line;
};

struct ZeroWorkerOptions {
  std::string mode = "ddp";
  bool no_prefetch = false;  // stage 3: ZeroOptions::prefetch = false
  int layers = 6;
  int width = 4096;
  int batch = 8;
  int steps = 3;
  int warmup_steps = 1;
};

int run_zero_bench(const ZeroBenchOptions& options);
int run_zero_worker(const ZeroWorkerOptions& options);

}  // namespace kolo::bench
