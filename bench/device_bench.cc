// `kolo-bench device` (device_bench.h).
#include "device_bench.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "bench_report.h"
#include "kolo/core/communicator.h"
#include "kolo/core/device.h"
#include "kolo/core/engine.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"

namespace kolo::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of `repeats` calls of `fn` after `warmup` untimed ones.
template <typename F>
double median_seconds(int warmup, int repeats, F&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = Clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

TensorView device_view(void* data, size_t floats) {
  TensorView v{data, DType::kF32, {static_cast<int64_t>(floats)}};
  v.device = Device{DeviceType::kCUDA, 0};
  return v;
}

}  // namespace

int run_device_bench(const DeviceBenchOptions& options) {
  std::shared_ptr<DeviceRuntime> cuda;
  try {
    cuda = cuda_runtime();
  } catch (const ContractError& e) {
    std::fprintf(stderr, "kolo-bench device: %s\n", e.what());
    return 2;
  }
  // NCCL at world size 1: the default runtime with NCCL insisted on.
  setenv("KOLO_CUDA_COMM", "nccl", 1);
  kolo::init();
  Engine& nccl_engine = kolo::runtime().engine();

  // Two ranks as threads sharing the GPU, staged through the threads backend.
  std::vector<std::unique_ptr<Communicator>> comms = make_thread_communicators(2);
  EngineOptions staged_options;
  staged_options.cycle_time_ms = 0;
  staged_options.cuda_comm = "staged";
  std::vector<std::unique_ptr<Engine>> staged(2);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        staged[r] = std::make_unique<Engine>(std::move(comms[r]), nullptr, staged_options);
      });
    }
    for (auto& t : threads) t.join();
  }

  Report report;
  report.title = "CUDA tensors on one GPU";
  report.columns = {"size", "device copy (GB/s)", "staged allreduce, 2 ranks (GB/s)",
                    "staged / copy", "NCCL allreduce, 1 rank (GB/s)"};
  std::mt19937 random(7);
  for (double mib : options.sizes_mib) {
    const size_t bytes = static_cast<size_t>(mib * (1 << 20)) / 4 * 4;
    const size_t floats = bytes / 4;
    std::vector<float> host(floats);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (float& x : host) x = dist(random);
    void* a = cuda->alloc_device(bytes, 0);
    void* b = cuda->alloc_device(bytes, 0);
    void* c = cuda->alloc_device(bytes, 0);
    cuda->copy_to_device(a, host.data(), bytes, 0);
    cuda->copy_to_device(b, host.data(), bytes, 0);
    cuda->copy_to_device(c, host.data(), bytes, 0);

    const double copy_s = median_seconds(options.warmup, options.repeats,
                                         [&] { cuda->copy_on_device(b, a, bytes, 0); });
    RequestOptions sum;
    sum.op = ReduceOp::kSum;
    const double staged_s = median_seconds(options.warmup, options.repeats, [&] {
      std::thread peer(
          [&] { staged[1]->allreduce("x", device_view(b, floats), device_view(b, floats), sum); });
      staged[0]->allreduce("x", device_view(a, floats), device_view(a, floats), sum);
      peer.join();
    });
    const double nccl_s = median_seconds(options.warmup, options.repeats, [&] {
      nccl_engine.allreduce("x", device_view(c, floats), device_view(c, floats), sum);
    });
    // One more staged call from known data: every element must be the sum.
    cuda->copy_to_device(a, host.data(), bytes, 0);
    cuda->copy_to_device(b, host.data(), bytes, 0);
    {
      std::thread peer(
          [&] { staged[1]->allreduce("x", device_view(b, floats), device_view(b, floats), sum); });
      staged[0]->allreduce("x", device_view(a, floats), device_view(a, floats), sum);
      peer.join();
    }
    std::vector<float> got(floats);
    cuda->copy_to_host(got.data(), a, bytes, 0);
    bool correct = true;
    for (size_t i = 0; i < floats && correct; ++i) correct = got[i] == 2 * host[i];
    if (!correct) throw RuntimeFault("kolo-bench device: the staged allreduce gave a wrong sum");
    cuda->free_device(a, 0);
    cuda->free_device(b, 0);
    cuda->free_device(c, 0);
    const double gb = static_cast<double>(bytes) / 1e9;
    report.add_row({format_bytes(static_cast<double>(bytes)), format_fixed(gb / copy_s, 1),
                    format_fixed(gb / staged_s, 2), format_fixed(copy_s / staged_s, 4),
                    format_fixed(gb / nccl_s, 1)},
                   {{"bytes", bytes},
                    {"copy_gbps", gb / copy_s},
                    {"staged_gbps", gb / staged_s},
                    {"nccl_gbps", gb / nccl_s},
                    {"result_checked", correct}});
  }
  report.notes.push_back(
      "Rates: the tensor's bytes over the median call (" + std::to_string(options.repeats) +
      " repetitions). Staged: device to pinned host memory, the threads backend's allreduce, "
      "back to the device, for each of the two ranks sharing the GPU. NCCL cannot run two "
      "ranks on one GPU, so its row is world size 1.");
  if (options.json) {
    for (const auto& row : report.json_rows) std::printf("%s\n", row.dump().c_str());
  } else {
    std::printf("%s", report.text().c_str());
  }
  if (!options.docs_path.empty()) {
    write_docs_section(options.docs_path, "device",
                       report.markdown() + "\nCommand: `" + options.command_line + "`\n");
  }
  staged.clear();
  kolo::shutdown();
  return 0;
}

}  // namespace kolo::bench
