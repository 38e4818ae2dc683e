// The CUDA runtime as the engine's DeviceRuntime (kolo/core/device.h).
#include <unistd.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cuda/cuda_api.h"
#include "kolo/core/device.h"

namespace kolo::detail {

namespace {

class CudaRuntime final : public DeviceRuntime {
 public:
  CudaRuntime() : api_(cuda_api()) {}
  ~CudaRuntime() override {
    // Streams stay: this object lives until the process ends, when the CUDA
    // runtime may already be torn down.
  }

  DeviceType type() const override { return DeviceType::kCUDA; }

  Event record(int device, void* stream) override {
    // On the caller's thread: its current device is put back afterwards
    // (PyTorch keeps its own idea of it).
    int previous = -1;
    api_.GetDevice(&previous);
    struct Restore {
      const CudaApi& api;
      int previous;
      int device;
      ~Restore() {
        if (previous >= 0 && previous != device) api.SetDevice(previous);
      }
    } restore{api_, previous, device};
    if (previous != device) api_.use(device);
    cudaEvent_t event = nullptr;
    api_.check(api_.EventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate",
               device);
    const CudaApi* api = &api_;
    Event owned(static_cast<void*>(event),
                [api](void* e) { api->EventDestroy(static_cast<cudaEvent_t>(e)); });
    api_.check(api_.EventRecord(event, static_cast<cudaStream_t>(stream)), "cudaEventRecord",
               device);
    return owned;
  }

  void wait(const Event& event) override {
    if (!event) return;
    api_.check(api_.EventSynchronize(static_cast<cudaEvent_t>(event.get())), "cudaEventSynchronize",
               -1);
  }

  void copy_to_host(void* host, const void* device_data, size_t bytes, int device) override {
    copy(host, device_data, bytes, cudaMemcpyDeviceToHost, device, "copy to the host");
  }
  void copy_to_device(void* device_data, const void* host, size_t bytes, int device) override {
    copy(device_data, host, bytes, cudaMemcpyHostToDevice, device, "copy to the device");
  }
  void copy_on_device(void* to, const void* from, size_t bytes, int device) override {
    copy(to, from, bytes, cudaMemcpyDeviceToDevice, device, "copy on the device");
  }
  void zero_on_device(void* device_data, size_t bytes, int device) override {
    if (bytes == 0) return;
    cudaStream_t s = stream(device);
    api_.check(api_.MemsetAsync(device_data, 0, bytes, s), "cudaMemsetAsync", device);
    api_.check(api_.StreamSynchronize(s), "cudaStreamSynchronize", device);
  }

  void* alloc_host(size_t bytes) override {
    void* data = nullptr;
    api_.check(api_.HostAlloc(&data, bytes ? bytes : 1, cudaHostAllocDefault), "cudaHostAlloc", -1);
    return data;
  }
  void free_host(void* data) noexcept override {
    if (data) api_.FreeHost(data);
  }
  void* alloc_device(size_t bytes, int device) override {
    api_.use(device);
    void* data = nullptr;
    api_.check(api_.Malloc(&data, bytes ? bytes : 1), "cudaMalloc", device);
    return data;
  }
  void free_device(void* data, int device) noexcept override {
    if (!data) return;
    if (api_.SetDevice(device) == cudaSuccess) api_.Free(data);
  }

  std::string identity(int device) override {
    char bus[64] = {0};
    api_.check(api_.DeviceGetPCIBusId(bus, sizeof bus, device), "cudaDeviceGetPCIBusId", device);
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    return std::string(host) + "/" + bus;
  }

 private:
  // The runtime's own stream on `device` (non-blocking: it does not wait for
  // the legacy default stream), made on first use.
  cudaStream_t stream(int device) {
    api_.use(device);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(device);
    if (it != streams_.end()) return it->second;
    cudaStream_t s = nullptr;
    api_.check(api_.StreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate", device);
    streams_[device] = s;
    return s;
  }

  void copy(void* to, const void* from, size_t bytes, cudaMemcpyKind kind, int device,
            const char* what) {
    if (bytes == 0) return;
    cudaStream_t s = stream(device);
    api_.check(api_.MemcpyAsync(to, from, bytes, kind, s), what, device);
    api_.check(api_.StreamSynchronize(s), what, device);
  }

  const CudaApi& api_;
  std::mutex mutex_;
  std::map<int, cudaStream_t> streams_;
};

}  // namespace

std::shared_ptr<DeviceRuntime> make_cuda_runtime() { return std::make_shared<CudaRuntime>(); }

}  // namespace kolo::detail
