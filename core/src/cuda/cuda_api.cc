// Loading the CUDA runtime and NCCL (cuda_api.h).
#include "cuda/cuda_api.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "kolo/core/errors.h"

namespace kolo::detail {

namespace {

// Binds `name` of `library` into `slot`; throws ContractError naming both.
template <typename F>
void bind(void* library, const char* soname, const char* name, F*& slot) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    throw ContractError(std::string("kolo cuda: ") + soname + " has no " + name +
                        "; it is older than the headers kolo was built with (CUDA " +
                        std::to_string(CUDART_VERSION / 1000) + ", NCCL " +
                        std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) +
                        "): put a matching library first on the loader's path");
  }
  slot = reinterpret_cast<F*>(symbol);
}

void* open_library(const std::string& soname, const char* what) {
  // RTLD_NOLOAD first: the copy this process mapped already (libtorch's),
  // whatever the search path says.
  void* library = dlopen(soname.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  if (library == nullptr) library = dlopen(soname.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (library == nullptr) {
    const char* error = dlerror();
    throw ContractError(std::string("kolo cuda: cannot load ") + soname + " (" + what +
                        "): " + (error ? error : "not found") +
                        ". Install the CUDA runtime (a CUDA build of torch from pip brings it "
                        "under site-packages/nvidia), or put its folder on LD_LIBRARY_PATH");
  }
  return library;
}

}  // namespace

std::string cudart_soname() { return "libcudart.so." + std::to_string(CUDART_VERSION / 1000); }

void CudaApi::check(cudaError_t error, const char* what, int device) const {
  if (error == cudaSuccess) return;
  throw RuntimeFault(std::string("kolo cuda: ") + what + " on cuda:" + std::to_string(device) +
                     " failed: " + GetErrorString(error) + " (error " +
                     std::to_string(static_cast<int>(error)) + ")");
}

void CudaApi::use(int device) const { check(SetDevice(device), "cudaSetDevice", device); }

const CudaApi& cuda_api() {
  static std::once_flag once;
  static CudaApi api;
  static std::string failure;
  std::call_once(once, [] {
    try {
      const std::string soname = cudart_soname();
      void* lib = open_library(soname, "the CUDA runtime");
      const char* so = soname.c_str();
      bind(lib, so, "cudaGetDeviceCount", api.GetDeviceCount);
      bind(lib, so, "cudaSetDevice", api.SetDevice);
      bind(lib, so, "cudaGetDevice", api.GetDevice);
      bind(lib, so, "cudaGetErrorString", api.GetErrorString);
      bind(lib, so, "cudaStreamCreateWithFlags", api.StreamCreateWithFlags);
      bind(lib, so, "cudaStreamDestroy", api.StreamDestroy);
      bind(lib, so, "cudaStreamSynchronize", api.StreamSynchronize);
      bind(lib, so, "cudaStreamQuery", api.StreamQuery);
      bind(lib, so, "cudaStreamWaitEvent", api.StreamWaitEvent);
      bind(lib, so, "cudaEventCreateWithFlags", api.EventCreateWithFlags);
      bind(lib, so, "cudaEventRecord", api.EventRecord);
      bind(lib, so, "cudaEventSynchronize", api.EventSynchronize);
      bind(lib, so, "cudaEventDestroy", api.EventDestroy);
      bind(lib, so, "cudaMemcpyAsync", api.MemcpyAsync);
      bind(lib, so, "cudaMemsetAsync", api.MemsetAsync);
      bind(lib, so, "cudaHostAlloc", api.HostAlloc);
      bind(lib, so, "cudaFreeHost", api.FreeHost);
      bind(lib, so, "cudaMalloc", api.Malloc);
      bind(lib, so, "cudaFree", api.Free);
      bind(lib, so, "cudaDeviceGetPCIBusId", api.DeviceGetPCIBusId);
      bind(lib, so, "cudaRuntimeGetVersion", api.RuntimeGetVersion);
      int count = 0;
      const cudaError_t error = api.GetDeviceCount(&count);
      if (error != cudaSuccess || count == 0) {
        throw ContractError(std::string("kolo cuda: no CUDA device is present (") + so +
                            " loaded; cudaGetDeviceCount: " +
                            (error != cudaSuccess ? api.GetErrorString(error) : "0 devices") +
                            "); run on a machine with a GPU, or keep tensors on the CPU");
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw ContractError(failure);
  return api;
}

const NcclApi& nccl_api() {
  cuda_api();
  static std::once_flag once;
  static NcclApi api;
  static std::string failure;
  std::call_once(once, [] {
    try {
      const char* so = "libnccl.so.2";
      void* lib = open_library(so, "NCCL");
      bind(lib, so, "ncclGetVersion", api.GetVersion);
      bind(lib, so, "ncclGetUniqueId", api.GetUniqueId);
      bind(lib, so, "ncclCommInitRankConfig", api.CommInitRankConfig);
      bind(lib, so, "ncclCommDestroy", api.CommDestroy);
      bind(lib, so, "ncclCommAbort", api.CommAbort);
      bind(lib, so, "ncclCommGetAsyncError", api.CommGetAsyncError);
      bind(lib, so, "ncclGetErrorString", api.GetErrorString);
      bind(lib, so, "ncclGetLastError", api.GetLastError);
      bind(lib, so, "ncclAllReduce", api.AllReduce);
      bind(lib, so, "ncclBroadcast", api.Broadcast);
      bind(lib, so, "ncclReduceScatter", api.ReduceScatter);
      bind(lib, so, "ncclAllGather", api.AllGather);
      bind(lib, so, "ncclSend", api.Send);
      bind(lib, so, "ncclRecv", api.Recv);
      bind(lib, so, "ncclGroupStart", api.GroupStart);
      bind(lib, so, "ncclGroupEnd", api.GroupEnd);
      api.GetVersion(&api.version);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw ContractError(failure);
  return api;
}

}  // namespace kolo::detail
