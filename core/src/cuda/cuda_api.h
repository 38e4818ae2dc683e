// The CUDA runtime and NCCL as kolo calls them (internal; built when the
// CUDA toolkit's headers and nccl.h were found: KOLO_HAVE_CUDA).
//
// Both libraries are loaded with dlopen by soname (libcudart.so.<major of
// the headers>, libnccl.so.2), never linked: the dynamic loader then hands
// back the copy this process already mapped (the torch wheel's libtorch_cuda
// loads the wheel's libcudart and libnccl), so one process maps one of each
// even where the CUDA toolkit has its own (docs/architecture.md, "One
// stack"). Where none is mapped yet, the loader's search path decides.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

namespace kolo::detail {

struct CudaApi {
  cudaError_t (*GetDeviceCount)(int*);
  cudaError_t (*SetDevice)(int);
  cudaError_t (*GetDevice)(int*);
  const char* (*GetErrorString)(cudaError_t);
  cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned int);
  cudaError_t (*StreamDestroy)(cudaStream_t);
  cudaError_t (*StreamSynchronize)(cudaStream_t);
  cudaError_t (*StreamQuery)(cudaStream_t);
  cudaError_t (*StreamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned int);
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t*, unsigned int);
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t);
  cudaError_t (*EventSynchronize)(cudaEvent_t);
  cudaError_t (*EventDestroy)(cudaEvent_t);
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t);
  cudaError_t (*MemsetAsync)(void*, int, size_t, cudaStream_t);
  cudaError_t (*HostAlloc)(void**, size_t, unsigned int);
  cudaError_t (*FreeHost)(void*);
  cudaError_t (*Malloc)(void**, size_t);
  cudaError_t (*Free)(void*);
  cudaError_t (*DeviceGetPCIBusId)(char*, int, int);
  cudaError_t (*RuntimeGetVersion)(int*);

  // Throws RuntimeFault "kolo cuda: <what> on device D: <error text>" unless
  // `error` is cudaSuccess.
  void check(cudaError_t error, const char* what, int device) const;
  // Makes `device` current on the calling thread (each thread has its own).
  void use(int device) const;
};

struct NcclApi {
  ncclResult_t (*GetVersion)(int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  const char* (*GetErrorString)(ncclResult_t);
  const char* (*GetLastError)(ncclComm_t);
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
  int version = 0;  // ncclGetVersion's code: 22809 for 2.28.9
};

// The process's CUDA runtime, loaded on the first call. Throws ContractError
// naming the library and dlerror() when it cannot be loaded, and when it has
// no device ("no CUDA device is present").
const CudaApi& cuda_api();
// The same for NCCL (which needs the CUDA runtime too).
const NcclApi& nccl_api();
// The soname cuda_api() loads: "libcudart.so.13".
std::string cudart_soname();

}  // namespace kolo::detail
