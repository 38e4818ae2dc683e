// The gpu tier: CUDA tensors on a real device. Every test skips (ctest
// reports the tier skipped, never passed) where no CUDA device is present;
// scripts/gpu_check.sh runs it on a GPU machine.
//
// What one GPU allows: ranks as threads sharing it through host staging (the
// route every host backend takes), and NCCL at world size 1. NCCL cannot
// run two ranks on one GPU; that is refused with a ContractError, tested too.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <set>
#include <string>

#include "kolo/core/device.h"
#include "kolo/core/runtime.h"
#include "kolo/torch/tensor.h"
#include "mapped_libraries.h"
#include "torch_harness.h"

namespace kolo {
namespace {

using testing::on;
using testing::run_with_engines;

#define KOLO_NEED_GPU()                                                        \
  do {                                                                         \
    if (!::torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here"; \
  } while (0)

const torch::Device kGpu(torch::kCUDA, 0);

// Rank r's data for a test: distinct per rank and element, never all zeros.
torch::Tensor data_of(int rank, std::vector<int64_t> shape,
                      torch::ScalarType type = torch::kFloat) {
  torch::manual_seed(1000 + rank);
  return torch::randn(shape, torch::kDouble).mul_(4).to(type);
}

TEST(Gpu, TheCudaRuntimeLoadsAndNamesTheDevice) {
  KOLO_NEED_GPU();
  std::shared_ptr<DeviceRuntime> cuda = cuda_runtime();
  EXPECT_EQ(cuda->type(), DeviceType::kCUDA);
  EXPECT_NE(cuda->identity(0).find("/"), std::string::npos) << cuda->identity(0);
}

TEST(Gpu, StagedCollectivesOfTwoRanksSharingOneGpuMatchTheCpu) {
  KOLO_NEED_GPU();
  const int n = 2;
  run_with_engines(n, [&](int rank, Engine& engine) {
    c10::cuda::CUDAGuard guard(0);
    // Fused small tensors and one large one, in float32 and bf16.
    for (auto type : {torch::kFloat, torch::kBFloat16}) {
      std::vector<torch::Tensor> cpu, gpu;
      std::vector<TensorHandle> handles;
      for (int t = 0; t < 4; ++t) {
        cpu.push_back(data_of(rank * 10 + t, {t == 3 ? 1 << 22 : 1000}, type));
        gpu.push_back(cpu.back().to(kGpu));
        TensorOpOptions o = on(engine);
        o.op = ReduceOp::kSum;
        handles.push_back(
            allreduce_async_(gpu.back(), "ar" + std::to_string(t) + c10::toString(type), o));
      }
      for (size_t t = 0; t < handles.size(); ++t) {
        torch::Tensor got = handles[t].wait().cpu();
        torch::Tensor expected = (data_of(t, cpu[t].sizes().vec(), type).to(torch::kDouble) +
                                  data_of(10 + t, cpu[t].sizes().vec(), type).to(torch::kDouble));
        const double tolerance = type == torch::kBFloat16 ? 0.05 : 1e-5;
        EXPECT_TRUE(torch::allclose(got.to(torch::kDouble), expected, tolerance, tolerance))
            << "tensor " << t << " " << c10::toString(type);
        EXPECT_TRUE(got.device().is_cpu());
        EXPECT_TRUE(handles[t].wait().device().is_cuda());
      }
    }
    // allgather of uneven rows: the output is on the GPU.
    torch::Tensor rows = data_of(rank, {rank + 2, 3}).to(kGpu);
    torch::Tensor gathered = allgather(rows, "ag", on(engine));
    EXPECT_TRUE(gathered.device().is_cuda());
    EXPECT_TRUE(torch::equal(gathered.cpu(), torch::cat({data_of(0, {2, 3}), data_of(1, {3, 3})})));
    // broadcast from rank 1, reducescatter, alltoall.
    torch::Tensor b = data_of(rank, {257}).to(kGpu);
    TensorOpOptions bo = on(engine);
    bo.root = 1;
    broadcast_(b, "bc", bo);
    EXPECT_TRUE(torch::equal(b.cpu(), data_of(1, {257})));
    TensorOpOptions so = on(engine);
    so.op = ReduceOp::kSum;
    torch::Tensor scattered = reducescatter(data_of(rank, {5, 2}).to(kGpu), "rs", so);
    torch::Tensor sum = data_of(0, {5, 2}) + data_of(1, {5, 2});
    EXPECT_TRUE(
        torch::allclose(scattered.cpu(), rank == 0 ? sum.slice(0, 0, 3) : sum.slice(0, 3, 5)));
    torch::Tensor a2a = alltoall(data_of(rank, {4}).to(kGpu), {}, "a2a", on(engine)).output;
    EXPECT_TRUE(a2a.device().is_cuda());
    EXPECT_TRUE(
        torch::equal(a2a.cpu(), torch::cat({data_of(0, {4}).slice(0, rank * 2, rank * 2 + 2),
                                            data_of(1, {4}).slice(0, rank * 2, rank * 2 + 2)})));
  });
}

TEST(Gpu, TheEngineWaitsForTheProducersStream) {
  // The tensor is written on a side stream right before the call: the
  // engine must read it after that work, not before (readiness event).
  KOLO_NEED_GPU();
  run_with_engines(2, [&](int rank, Engine& engine) {
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
    torch::Tensor x = torch::zeros({1 << 24}, torch::TensorOptions().device(kGpu));
    torch::cuda::synchronize();
    {
      c10::cuda::CUDAStreamGuard guard(side);
      // Slow enough to still be running when the engine looks.
      torch::Tensor big = torch::randn({4096, 4096}, torch::TensorOptions().device(kGpu));
      for (int i = 0; i < 8; ++i) big = big.mm(big).div_(4096);
      x.fill_(static_cast<float>(rank + 1));
      TensorOpOptions o = on(engine);
      o.op = ReduceOp::kSum;
      allreduce_(x, "late", o);
    }
    EXPECT_EQ(x.min().item<float>(), 3.0f);
    EXPECT_EQ(x.max().item<float>(), 3.0f);
  });
}

// Every file of library `name` ("libnccl") this process maps.
std::set<std::string> mapped(const std::string& name) {
  const auto libraries = testing::mapped_libraries();
  auto it = libraries.find(name);
  return it == libraries.end() ? std::set<std::string>{} : it->second;
}

TEST(Gpu, NcclAtWorldSizeOneRunsEveryCollectiveAndMapsOneNccl) {
  KOLO_NEED_GPU();
  setenv("KOLO_CUDA_COMM", "nccl", 1);
  kolo::init();
  struct Down {
    ~Down() {
      kolo::shutdown();
      unsetenv("KOLO_CUDA_COMM");
    }
  } down;
  for (auto type : {torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kLong, torch::kByte}) {
    torch::Tensor x = data_of(0, {3000}, type).to(kGpu);
    torch::Tensor y = allreduce(x, std::string("nccl/") + c10::toString(type));
    EXPECT_TRUE(torch::equal(y.cpu(), x.cpu())) << c10::toString(type);
  }
  // int16 and a postscale are staged, with the same result.
  torch::Tensor s = data_of(0, {100}, torch::kShort).to(kGpu);
  EXPECT_TRUE(torch::equal(allreduce(s, "staged/int16").cpu(), s.cpu()));
  TensorOpOptions scaled;
  scaled.op = ReduceOp::kSum;
  scaled.postscale = 0.5;
  torch::Tensor f = data_of(1, {100}).to(kGpu);
  EXPECT_TRUE(torch::allclose(allreduce(f, "staged/postscale", scaled).cpu(), f.cpu() * 0.5));
  torch::Tensor g = allgather(data_of(2, {7, 2}).to(kGpu), "nccl/ag");
  EXPECT_TRUE(torch::equal(g.cpu(), data_of(2, {7, 2})));
  torch::Tensor b = data_of(3, {9}).to(kGpu);
  broadcast_(b, "nccl/bc");
  EXPECT_TRUE(torch::equal(b.cpu(), data_of(3, {9})));
  torch::Tensor rs = reducescatter(data_of(4, {6}).to(kGpu), "nccl/rs");
  EXPECT_TRUE(torch::allclose(rs.cpu(), data_of(4, {6})));
  torch::Tensor a = alltoall(data_of(5, {4}).to(kGpu), {}, "nccl/a2a").output;
  EXPECT_TRUE(torch::equal(a.cpu(), data_of(5, {4})));
  EXPECT_EQ(mapped("libnccl").size(), 1u) << "more than one libnccl is mapped";
  EXPECT_EQ(mapped("libcudart").size(), 1u) << "more than one libcudart is mapped";
}

}  // namespace
}  // namespace kolo
