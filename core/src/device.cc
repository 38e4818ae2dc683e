// Devices (kolo/core/device.h).
#include "kolo/core/device.h"

#include <mutex>

#include "kolo/core/errors.h"

namespace kolo {

#if KOLO_HAVE_CUDA
namespace detail {
std::shared_ptr<DeviceRuntime> make_cuda_runtime();  // cuda/cuda_runtime.cc
int nccl_version();                                  // comm/nccl_communicator.cc
}  // namespace detail
#endif

const char* device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kCUDA:
      return "cuda";
  }
  return "unknown";
}

std::string Device::str() const {
  if (type == DeviceType::kCPU) return "cpu";
  return std::string(device_type_name(type)) + ":" + std::to_string(index);
}

bool cuda_compiled() {
#if KOLO_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int nccl_version() {
#if KOLO_HAVE_CUDA
  try {
    return detail::nccl_version();
  } catch (const ContractError&) {
    return 0;
  }
#else
  return 0;
#endif
}

std::shared_ptr<DeviceRuntime> cuda_runtime() {
#if KOLO_HAVE_CUDA
  // One per process, as the CUDA runtime it wraps; made on first use so
  // that a CPU-only program never loads libcudart.
  static std::mutex mutex;
  static std::shared_ptr<DeviceRuntime> runtime;
  std::lock_guard<std::mutex> lock(mutex);
  if (!runtime) runtime = detail::make_cuda_runtime();
  return runtime;
#else
  throw ContractError(
      "kolo: this build of kolo has no CUDA support (the CUDA toolkit's headers and nccl.h "
      "were not found when it was built); rebuild with the toolkit installed, or keep tensors "
      "on the CPU");
#endif
}

}  // namespace kolo
