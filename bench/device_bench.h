// `kolo-bench device`: CUDA tensors on one GPU (run as a plain process). Per
// message size: the device's own copy rate (device to device), an allreduce
// of two ranks (threads) sharing the GPU through host staging, that
// allreduce's rate against the copy rate, and an allreduce on NCCL at world
// size 1 (what one GPU allows: NCCL cannot run two ranks on one GPU). Rates
// are the tensor's bytes over the call's time (algorithm bandwidth), the
// median of the repetitions. Without a device it says why and exits 2.
#pragma once

#include <string>
#include <vector>

namespace kolo::bench {

struct DeviceBenchOptions {
  std::vector<double> sizes_mib = {1, 16, 64, 256};
  int repeats = 10;
  int warmup = 2;
  bool json = false;
  std::string docs_path;  // when set, rewrites the device section of this file
  std::string command_line;
};

int run_device_bench(const DeviceBenchOptions& options);

}  // namespace kolo::bench
