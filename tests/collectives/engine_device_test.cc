// CUDA tensors in the engine without a GPU: a fake DeviceRuntime whose
// "device memory" is host memory it hands out and tracks. What is tested
// here is the engine's side of the device path: readiness events recorded at
// submit and waited for before the data is read, host staging (mirrors in,
// results back, allocated outputs on the device), fusion of staged tensors,
// joined ranks, the device agreeing across ranks, the route vote, and the
// errors of a rank with two GPUs or no CUDA at all. The same paths on a real
// GPU are the gpu tier's (tests/gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine_harness.h"
#include "kolo/core/device.h"
#include "kolo/core/errors.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using testing::EngineWorld;
using testing::test_engine_options;

// A DeviceRuntime over host memory: device allocations are tracked, so that
// every copy can check it goes between the right kinds of memory, and a
// staged collective that touched device memory directly would be caught.
class FakeDevice final : public DeviceRuntime {
 public:
  explicit FakeDevice(std::string identity = "fake-gpu") : identity_(std::move(identity)) {}
  ~FakeDevice() override {
    for (auto& [p, bytes] : device_) std::free(p);
  }
  DeviceType type() const override { return DeviceType::kCUDA; }

  Event record(int device, void* stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++records;
    last_stream = stream;
    auto* passed = new bool(false);
    return Event(passed, [](void* p) { delete static_cast<bool*>(p); });
  }
  void wait(const Event& event) override {
    ASSERT_TRUE(event) << "waited for a null event";
    std::lock_guard<std::mutex> lock(mutex_);
    *static_cast<bool*>(event.get()) = true;
    ++waits;
  }
  void copy_to_host(void* host, const void* device_data, size_t bytes, int device) override {
    check_device(device_data, "copy_to_host source");
    check_host(host, "copy_to_host target");
    std::memcpy(host, device_data, bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    to_host += bytes;
  }
  void copy_to_device(void* device_data, const void* host, size_t bytes, int device) override {
    check_device(device_data, "copy_to_device target");
    check_host(host, "copy_to_device source");
    std::memcpy(device_data, host, bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    to_device += bytes;
  }
  void copy_on_device(void* to, const void* from, size_t bytes, int device) override {
    check_device(to, "copy_on_device target");
    check_device(from, "copy_on_device source");
    std::memcpy(to, from, bytes);
  }
  void zero_on_device(void* data, size_t bytes, int device) override {
    check_device(data, "zero_on_device");
    std::memset(data, 0, bytes);
  }
  void* alloc_host(size_t bytes) override {
    void* p = std::malloc(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    ++host_allocations;
    return p;
  }
  void free_host(void* data) noexcept override { std::free(data); }
  void* alloc_device(size_t bytes, int device) override {
    void* p = std::calloc(bytes ? bytes : 1, 1);
    std::lock_guard<std::mutex> lock(mutex_);
    device_[p] = bytes ? bytes : 1;
    return p;
  }
  void free_device(void* data, int device) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    device_.erase(data);
    std::free(data);
  }
  std::string identity(int device) override { return identity_; }

  // A "device" buffer of `count` floats.
  float* device_floats(size_t count) { return static_cast<float*>(alloc_device(count * 4, 0)); }

  std::mutex mutex_;
  int records = 0;
  int waits = 0;
  int host_allocations = 0;
  size_t to_host = 0;
  size_t to_device = 0;
  void* last_stream = nullptr;

 private:
  // Device pointers may point inside an allocation (views, offsets).
  bool is_device(const void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = device_.upper_bound(const_cast<void*>(p));
    if (it == device_.begin()) return false;
    --it;
    return static_cast<const uint8_t*>(p) < static_cast<uint8_t*>(it->first) + it->second;
  }
  void check_device(const void* p, const char* what) {
    EXPECT_TRUE(is_device(p)) << what << " is not device memory";
  }
  void check_host(const void* p, const char* what) {
    EXPECT_FALSE(is_device(p)) << what << " is device memory";
  }
  std::string identity_;
  std::map<void*, size_t> device_;  // device allocations: base -> bytes
};

TensorView cuda_view(float* data, std::vector<int64_t> shape, void* stream = nullptr) {
  TensorView v{data, DType::kF32, std::move(shape)};
  v.device = Device{DeviceType::kCUDA, 0};
  v.stream = stream;
  return v;
}

EngineOptions with_device(std::shared_ptr<DeviceRuntime> device, std::string cuda_comm = "auto") {
  EngineOptions o = test_engine_options();
  o.device_runtime = std::move(device);
  o.cuda_comm = std::move(cuda_comm);
  return o;
}

class EngineDevice : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineDevice, StagedAllreduceFusesAndMatchesTheHostResult) {
  const int n = 2;
  EngineWorld world(GetParam(), n);
  testing::run_ranks(n, [&](int rank) {
    auto device = std::make_shared<FakeDevice>();
    auto engine = world.engine(rank, with_device(device));
    // Three tensors, fused into one batch; the producer's stream travels along.
    std::vector<float*> data;
    std::vector<Handle> handles;
    void* stream = reinterpret_cast<void*>(0x1234);
    for (int t = 0; t < 3; ++t) {
      float* d = device->device_floats(100);
      for (int i = 0; i < 100; ++i) d[i] = static_cast<float>(rank * 1000 + t * 100 + i);
      data.push_back(d);
      RequestOptions o;
      o.op = ReduceOp::kSum;
      handles.push_back(engine->allreduce_async("grad/" + std::to_string(t),
                                                cuda_view(d, {100}, stream),
                                                cuda_view(d, {100}, stream), o));
    }
    for (Handle& h : handles) h.wait();
    for (int t = 0; t < 3; ++t) {
      for (int i = 0; i < 100; ++i) {
        ASSERT_EQ(data[t][i], static_cast<float>(1000 + 2 * (t * 100 + i))) << t << " " << i;
      }
    }
    std::lock_guard<std::mutex> lock(device->mutex_);
    EXPECT_EQ(device->records, 3);
    EXPECT_EQ(device->waits, 3);
    EXPECT_EQ(device->last_stream, stream);
    EXPECT_EQ(device->to_host, 3u * 400u);
    EXPECT_EQ(device->to_device, 3u * 400u);
  });
}

TEST_P(EngineDevice, StagedMirrorsAreReusedAcrossSteps) {
  const int n = 2;
  EngineWorld world(GetParam(), n);
  testing::run_ranks(n, [&](int rank) {
    auto device = std::make_shared<FakeDevice>();
    auto engine = world.engine(rank, with_device(device));
    float* d = device->device_floats(1000);
    int after_first = 0;
    for (int step = 0; step < 5; ++step) {
      std::fill(d, d + 1000, 1.0f);
      engine->allreduce("w", cuda_view(d, {1000}), cuda_view(d, {1000}));
      ASSERT_EQ(d[999], 1.0f);  // average of ones
      if (step == 0) {
        std::lock_guard<std::mutex> lock(device->mutex_);
        after_first = device->host_allocations;
      }
    }
    std::lock_guard<std::mutex> lock(device->mutex_);
    EXPECT_EQ(device->host_allocations, after_first) << "steady steps allocate no pinned memory";
  });
}

TEST_P(EngineDevice, StagedAllgatherBroadcastReducescatterAndAlltoall) {
  const int n = 3;
  EngineWorld world(GetParam(), n);
  testing::run_ranks(n, [&](int rank) {
    auto device = std::make_shared<FakeDevice>();
    auto engine = world.engine(rank, with_device(device));
    // allgather: rank r gives r + 1 rows of 2; the output is allocated on the device.
    const int rows = rank + 1;
    float* in = device->device_floats(rows * 2);
    for (int i = 0; i < rows * 2; ++i) in[i] = static_cast<float>(rank * 10 + i);
    float* gathered = nullptr;
    Handle g = engine->allgather_async("ag", cuda_view(in, {rows, 2}),
                                       [&](const std::vector<int64_t>& shape) {
                                         gathered = device->device_floats(shape[0] * shape[1]);
                                         return cuda_view(gathered, shape);
                                       });
    g.wait();
    ASSERT_NE(gathered, nullptr);
    EXPECT_EQ(g.output().data, gathered) << "the handle's output is the device buffer";
    EXPECT_EQ(g.output().device.type, DeviceType::kCUDA);
    int at = 0;
    for (int k = 0; k < n; ++k) {
      for (int i = 0; i < (k + 1) * 2; ++i) ASSERT_EQ(gathered[at++], k * 10 + i);
    }
    // broadcast from rank 2.
    float* b = device->device_floats(4);
    for (int i = 0; i < 4; ++i) b[i] = static_cast<float>(rank == 2 ? 7 + i : -1);
    RequestOptions bo;
    bo.root = 2;
    engine->broadcast("bc", cuda_view(b, {4}), bo);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(b[i], 7 + i);
    // reducescatter of 4 rows over 3 ranks (2, 1, 1 rows), in place.
    float* rs = device->device_floats(4);
    for (int i = 0; i < 4; ++i) rs[i] = static_cast<float>(i + 1);
    const auto shape = Engine::reducescatter_shape({4}, n, rank);
    RequestOptions so;
    so.op = ReduceOp::kSum;
    engine->reducescatter_async("rs", cuda_view(rs, {4}), cuda_view(rs, shape), so).wait();
    const int first = rank == 0 ? 0 : rank + 1;
    for (int64_t i = 0; i < shape[0]; ++i) ASSERT_EQ(rs[i], 3.0f * (first + i + 1));
    // alltoall: one row to each rank.
    float* a = device->device_floats(n);
    for (int k = 0; k < n; ++k) a[k] = static_cast<float>(rank * 10 + k);
    float* received = nullptr;
    engine
        ->alltoall_async("a2a", cuda_view(a, {n}), {},
                         [&](const std::vector<int64_t>& shape) {
                           received = device->device_floats(shape[0]);
                           return cuda_view(received, shape);
                         })
        .wait();
    for (int k = 0; k < n; ++k) ASSERT_EQ(received[k], k * 10 + rank);
  });
}

TEST_P(EngineDevice, JoinedRanksTakePartInStagedCollectives) {
  const int n = 2;
  EngineWorld world(GetParam(), n);
  testing::run_ranks(n, [&](int rank) {
    auto device = std::make_shared<FakeDevice>();
    auto engine = world.engine(rank, with_device(device));
    if (rank == 1) {
      engine->join();
      return;
    }
    float* d = device->device_floats(8);
    std::fill(d, d + 8, 4.0f);
    engine->allreduce("late", cuda_view(d, {8}), cuda_view(d, {8}));  // average over 1 rank
    for (int i = 0; i < 8; ++i) ASSERT_EQ(d[i], 4.0f);
    engine->join();
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineDevice,
                         ::testing::ValuesIn(std::vector<std::string>{"threads", "shm"}));

TEST(EngineDeviceErrors, ADeviceMismatchAcrossRanksFailsOnEveryRank) {
  const int n = 2;
  EngineWorld world("threads", n);
  testing::run_ranks(n, [&](int rank) {
    auto device = std::make_shared<FakeDevice>();
    auto engine = world.engine(rank, with_device(device));
    std::vector<float> host(4, 1.0f);
    float* d = device->device_floats(4);
    TensorView view = rank == 0 ? cuda_view(d, {4}) : TensorView{host.data(), DType::kF32, {4}};
    try {
      engine->allreduce("x", view, view);
      FAIL() << "rank " << rank << ": no error";
    } catch (const ContractError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("Mismatched ALLREDUCE devices"), std::string::npos) << what;
      EXPECT_NE(what.find("a cuda tensor"), std::string::npos) << what;
      EXPECT_NE(what.find("a cpu tensor"), std::string::npos) << what;
    }
    // The engine is still in step.
    std::fill(host.begin(), host.end(), 2.0f);
    TensorView h{host.data(), DType::kF32, {4}};
    engine->allreduce("y", h, h);
    EXPECT_EQ(host[0], 2.0f);
  });
}

TEST(EngineDeviceErrors, NcclInsistedOnWhereItCannotRunFailsOnEveryRankAndStagingGoesOn) {
  const int n = 2;
  EngineWorld world("threads", n);
  testing::run_ranks(n, [&](int rank) {
    auto device = std::make_shared<FakeDevice>();
    // No device_communicators: these ranks cannot run NCCL.
    auto engine = world.engine(rank, with_device(device, "nccl"));
    float* d = device->device_floats(4);
    try {
      engine->allreduce("x", cuda_view(d, {4}), cuda_view(d, {4}));
      FAIL() << "rank " << rank << ": no error";
    } catch (const ContractError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("KOLO_CUDA_COMM=nccl"), std::string::npos) << what;
      EXPECT_NE(what.find("rank(s) 0, 1 cannot run NCCL"), std::string::npos) << what;
    }
  });
}

TEST(EngineDeviceErrors, RanksSharingOneGpuAreStagedNotNccl) {
  // Both ranks report the same GPU: even with a device communicator factory,
  // "auto" must stage (NCCL cannot run two ranks on one GPU) and never call it.
  const int n = 2;
  EngineWorld world("threads", n);
  std::atomic<int> factory_calls{0};
  testing::run_ranks(n, [&](int rank) {
    auto device = std::make_shared<FakeDevice>("one-gpu");
    EngineOptions o = with_device(device);
    o.device_communicators = [&](const std::vector<int>&, int, int) {
      ++factory_calls;
      return std::unique_ptr<Communicator>();
    };
    auto engine = world.engine(rank, o);
    float* d = device->device_floats(4);
    std::fill(d, d + 4, static_cast<float>(rank));
    RequestOptions ro;
    ro.op = ReduceOp::kSum;
    engine->allreduce("x", cuda_view(d, {4}), cuda_view(d, {4}), ro);
    EXPECT_EQ(d[0], 1.0f);
  });
  EXPECT_EQ(factory_calls.load(), 0);
}

TEST(EngineDeviceErrors, ASecondGpuOnOneRankIsRefusedAtSubmit) {
  EngineWorld world("threads", 1);
  auto device = std::make_shared<FakeDevice>();
  auto engine = world.engine(0, with_device(device));
  float* d = device->device_floats(4);
  engine->allreduce("a", cuda_view(d, {4}), cuda_view(d, {4}));
  TensorView other = cuda_view(d, {4});
  other.device.index = 1;
  try {
    engine->allreduce("b", other, other);
    FAIL() << "no error";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("is on cuda:1, but this rank's earlier CUDA tensors are "
                                         "on cuda:0"),
              std::string::npos)
        << e.what();
  }
}

TEST(EngineDeviceErrors, ACudaTensorWithoutAGpuIsAContractErrorSayingWhy) {
  // The real CUDA runtime: on a machine without a GPU (or a build without
  // CUDA) the submit fails at once, naming the tensor and the reason.
  bool have_gpu = false;
  try {
    cuda_runtime();
    have_gpu = true;
  } catch (const ContractError&) {
  }
  if (have_gpu) GTEST_SKIP() << "this machine has a CUDA device (the gpu tier tests it)";
  EngineWorld world("threads", 1);
  auto engine = world.engine(0, test_engine_options());
  std::vector<float> fake(4);
  TensorView view = cuda_view(fake.data(), {4});
  try {
    engine->allreduce("grad/w", view, view);
    FAIL() << "no error";
  } catch (const ContractError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ALLREDUCE of tensor 'grad/w' is a CUDA tensor, but"), std::string::npos)
        << what;
    EXPECT_TRUE(what.find("no CUDA device is present") != std::string::npos ||
                what.find("no CUDA support") != std::string::npos ||
                what.find("cannot load") != std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace kolo
