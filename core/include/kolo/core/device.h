// Devices: where a TensorView's memory lives, and the device operations the
// engine uses to move device tensors.
//
// A CUDA tensor reaches the engine with its device and the stream it was
// produced on. The engine records an event on that stream when the request
// is submitted (on the caller's thread, so the event covers exactly the work
// queued before the call, as DDP's and Horovod's readiness events do) and
// reads the tensor only once the event has passed. It then either runs the
// collective on a device communicator (NCCL), with fusion buffers in device
// memory, or stages the tensor through pinned host memory into the host
// communicator (shm, gloo, mpi, threads): docs/architecture.md, "Devices".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kolo/core/export.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// A wire value (ranks compare it in negotiation): new types are appended.
enum class DeviceType : uint8_t { kCPU = 0, kCUDA = 1 };
constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // the CUDA device ordinal (as cudaSetDevice takes it); 0 for the CPU

  bool is_cpu() const { return type == DeviceType::kCPU; }
  // "cpu", "cuda:1".
  std::string str() const;
  bool operator==(const Device& other) const {
    return type == other.type && (type == DeviceType::kCPU || index == other.index);
  }
  bool operator!=(const Device& other) const { return !(*this == other); }
};

// "cpu", "cuda".
const char* device_type_name(DeviceType type);

// The device operations the engine needs: the CUDA runtime's (cuda_runtime()),
// or a test's fake one (EngineOptions::device_runtime). Every call is
// thread-safe. Errors throw RuntimeFault naming the call and the device's
// error text.
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual DeviceType type() const = 0;

  // A marker of the work queued so far on `stream` (a cudaStream_t; null is
  // the legacy default stream) of device `device`. Released with the last copy.
  using Event = std::shared_ptr<void>;
  virtual Event record(int device, void* stream) = 0;
  // Blocks the calling thread until `event` has passed (null: returns at once).
  virtual void wait(const Event& event) = 0;

  // Copies that return once the bytes have arrived. `host` is any host memory
  // (pinned memory from alloc_host copies fastest); device pointers belong to
  // `device`. The copies run on a stream of the runtime's own.
  virtual void copy_to_host(void* host, const void* device_data, size_t bytes, int device) = 0;
  virtual void copy_to_device(void* device_data, const void* host, size_t bytes, int device) = 0;
  virtual void copy_on_device(void* to, const void* from, size_t bytes, int device) = 0;
  virtual void zero_on_device(void* device_data, size_t bytes, int device) = 0;

  // Page-locked host memory (staging buffers) and device memory.
  virtual void* alloc_host(size_t bytes) = 0;
  virtual void free_host(void* data) noexcept = 0;
  virtual void* alloc_device(size_t bytes, int device) = 0;
  virtual void free_device(void* data, int device) noexcept = 0;

  // Identifies the physical device across processes: two ranks whose
  // identities are equal share one GPU (NCCL cannot run between them).
  virtual std::string identity(int device) = 0;
};

// The CUDA runtime of this process: libcudart, loaded with dlopen on the
// first call (the one libtorch already loaded, where it did). Throws
// ContractError saying what is missing when kolo was built without CUDA, no
// libcudart can be loaded, or the machine has no CUDA device.
std::shared_ptr<DeviceRuntime> cuda_runtime();

// Whether this build of kolo has its CUDA code (the toolkit was found at
// build time); says nothing of the machine it runs on.
bool cuda_compiled();

// The version code of the NCCL this process can load (22809 for 2.28.9),
// loading it; 0 where kolo was built without CUDA or no NCCL (or no GPU) is
// there. Horovod's nccl_built().
int nccl_version();

}  // namespace kolo
#pragma GCC visibility pop
