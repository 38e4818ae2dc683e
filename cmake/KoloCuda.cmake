# The CUDA path: sets KOLO_HAVE_CUDA and KOLO_CUDA_INCLUDE_DIRS.
#
# Compiled when the CUDA toolkit's runtime headers (cuda_runtime_api.h) and
# nccl.h are found. Nothing links libcudart or libnccl: core/src/cuda loads
# them at run time by soname (dlopen), so a process maps the copies libtorch
# already loaded, and a CPU-only machine runs the same build (a CUDA tensor
# then gets a ContractError saying no device is present).
#
# nccl.h: the torch wheel's (site-packages/nvidia/nccl/include, the NCCL that
# libtorch_cuda loads) before the CUDA toolkit's or the system's, so that the
# headers match the library the process maps.
set(KOLO_HAVE_CUDA OFF)
set(KOLO_CUDA_INCLUDE_DIRS "")
if(KOLO_WITH_CUDA)
  find_package(CUDAToolkit QUIET)
  set(_kolo_cuda_hints "")
  if(CUDAToolkit_FOUND)
    list(APPEND _kolo_cuda_hints ${CUDAToolkit_INCLUDE_DIRS})
  endif()
  find_path(KOLO_CUDART_INCLUDE_DIR cuda_runtime_api.h
            HINTS ${_kolo_cuda_hints} PATHS /usr/local/cuda/include /usr/include)
  set(_kolo_nccl_hints "")
  if(TORCH_INSTALL_PREFIX)
    get_filename_component(_kolo_wheel_nccl ${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include ABSOLUTE)
    list(APPEND _kolo_nccl_hints ${_kolo_wheel_nccl})
  endif()
  find_path(KOLO_NCCL_INCLUDE_DIR nccl.h HINTS ${_kolo_nccl_hints} ${_kolo_cuda_hints}
            PATHS /usr/local/cuda/include /usr/include NO_CACHE)
  if(KOLO_CUDART_INCLUDE_DIR AND KOLO_NCCL_INCLUDE_DIR)
    set(KOLO_HAVE_CUDA ON)
    # nccl.h first: the toolkit's folder may hold an nccl.h of another version.
    set(KOLO_CUDA_INCLUDE_DIRS ${KOLO_NCCL_INCLUDE_DIR} ${KOLO_CUDART_INCLUDE_DIR})
  endif()
endif()
message(STATUS "kolo: CUDA path ${KOLO_HAVE_CUDA} (cuda_runtime_api.h: ${KOLO_CUDART_INCLUDE_DIR}; "
               "nccl.h: ${KOLO_NCCL_INCLUDE_DIR})")
