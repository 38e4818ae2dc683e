# Finds libtorch for the libtorch frontend (torch/, kolo::torch) and sets
# KOLO_HAVE_TORCH, Torch_VERSION, TORCH_LIBRARIES and TORCH_INSTALL_PREFIX.
#
# Which libtorch, in order:
#   1. one the caller names: Torch_DIR, or a CMAKE_PREFIX_PATH that holds
#      Torch/TorchConfig.cmake (pytorch.org's libtorch zip, a wheel's
#      torch.utils.cmake_prefix_path);
#   2. the one inside the `torch` wheel of KOLO_PYTHON, the interpreter of the
#      Python frontend, which defaults to the project's virtual environment
#      .venv/bin/python (scripts/setup.sh makes it and installs torch from
#      PyPI into it), else Debian's /usr/bin/python3;
#   3. a system libtorch (Debian's libtorch-dev).
#
# One process maps one libtorch: a wheel's TorchConfig.cmake looks up c10
# and torch with find_library(... PATHS <wheel>/lib), which searches the
# system's folders first and so takes Debian's libc10.so 1.13 beside the
# wheel's libtorch where both are installed. The wheel's prefix goes first on
# CMAKE_PREFIX_PATH, which find_library searches before the system's folders.
# The same goes for NCCL: the wheel's libtorch_cuda.so needs the libnccl.so.2
# of the wheel's nvidia-nccl package (site-packages/nvidia/nccl/lib), and the
# linker would take the CUDA toolkit's older one instead (undefined
# ncclWinGetUserPtr ...): KOLO_TORCH_LINK_OPTIONS carries -rpath-link to the
# wheel's nvidia library folders for every target that links libtorch.
#
# Supported: libtorch 1.13 (Debian 12) to 2.x. Outside that range configure
# stops with the found version.
set(KOLO_TORCH_MIN_VERSION 1.13)
set(KOLO_TORCH_MAX_VERSION_EXCLUSIVE 3.0)

if(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  set(_kolo_default_python ${PROJECT_SOURCE_DIR}/.venv/bin/python)
else()
  set(_kolo_default_python /usr/bin/python3)
endif()
set(KOLO_PYTHON ${_kolo_default_python} CACHE FILEPATH
    "Python interpreter of the kolo.torch module; its torch's libtorch is the default libtorch")

set(KOLO_HAVE_TORCH OFF)
set(KOLO_TORCH_LINK_OPTIONS "")
set(KOLO_TORCH_FROM "")
if(KOLO_WITH_TORCH)
  get_property(KOLO_TARGETS_BEFORE_TORCH DIRECTORY PROPERTY IMPORTED_TARGETS)
  # 1. named by the caller?
  set(_kolo_torch_named OFF)
  if(Torch_DIR AND EXISTS ${Torch_DIR}/TorchConfig.cmake)
    set(_kolo_torch_named ON)
  endif()
  foreach(prefix ${CMAKE_PREFIX_PATH})
    if(EXISTS ${prefix}/Torch/TorchConfig.cmake OR EXISTS ${prefix}/share/cmake/Torch/TorchConfig.cmake)
      set(_kolo_torch_named ON)
    endif()
  endforeach()
  # 2. KOLO_PYTHON's torch wheel. From "/": a directory named torch/ in the
  # working directory (this repository has one) would shadow the package.
  if(NOT _kolo_torch_named AND EXISTS ${KOLO_PYTHON})
    execute_process(
      COMMAND ${KOLO_PYTHON} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
      WORKING_DIRECTORY /
      RESULT_VARIABLE _kolo_result
      OUTPUT_VARIABLE _kolo_wheel_cmake
      ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_kolo_result EQUAL 0 AND EXISTS ${_kolo_wheel_cmake}/Torch/TorchConfig.cmake)
      get_filename_component(_kolo_wheel ${_kolo_wheel_cmake}/../.. ABSOLUTE)
      list(PREPEND CMAKE_PREFIX_PATH ${_kolo_wheel} ${_kolo_wheel_cmake})
      set(KOLO_TORCH_FROM " (the torch wheel of ${KOLO_PYTHON})")
    endif()
  endif()
  find_package(Torch QUIET)
  if(Torch_FOUND)
    if(Torch_VERSION VERSION_LESS KOLO_TORCH_MIN_VERSION
       OR NOT Torch_VERSION VERSION_LESS KOLO_TORCH_MAX_VERSION_EXCLUSIVE)
      message(FATAL_ERROR
              "kolo: found libtorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}; kolo supports "
              "${KOLO_TORCH_MIN_VERSION} <= libtorch < ${KOLO_TORCH_MAX_VERSION_EXCLUSIVE}. Point "
              "-DTorch_DIR or -DKOLO_PYTHON at a supported one (bash scripts/setup.sh installs "
              "the newest torch into .venv), or build without the frontend: -DKOLO_WITH_TORCH=OFF")
    endif()
    set(KOLO_HAVE_TORCH ON)
    # Debian's libtorch-dev (its libraries in the system's folders): the one
    # a Debian package of kolo can depend on (cmake/package.cmake).
    # KOLO_TORCH_LIB_DIR: the folder of the libtorch found (KoloPython.cmake
    # takes libtorch_python from there). KOLO_TORCH_RUNPATH: where an
    # installed libkolo_torch.so (and whatever else links libtorch) finds
    # libtorch's libraries, which are in no system folder unless they are
    # Debian's (cmake/install.cmake).
    get_filename_component(KOLO_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
    if(TORCH_LIBRARY MATCHES "^/usr/lib/")
      set(KOLO_TORCH_IS_DEBIAN ON)
      set(KOLO_TORCH_RUNPATH "")
      set(KOLO_TORCH_PREFIX_FOR_CONSUMERS "")
    else()
      set(KOLO_TORCH_IS_DEBIAN OFF)
      set(KOLO_TORCH_RUNPATH "${KOLO_TORCH_LIB_DIR}")
      # kolo-config.cmake finds the same libtorch for a consumer (install.cmake).
      set(KOLO_TORCH_PREFIX_FOR_CONSUMERS "${TORCH_INSTALL_PREFIX}")
    endif()
    # The wheel's CUDA libraries live beside it in site-packages/nvidia/*/lib
    # (a libtorch zip or Debian's package has none there: nothing is added).
    file(GLOB _kolo_nvidia_libs LIST_DIRECTORIES true ${TORCH_INSTALL_PREFIX}/../nvidia/*/lib
         ${TORCH_INSTALL_PREFIX}/../nvidia/*/*/lib)
    foreach(dir ${_kolo_nvidia_libs})
      if(IS_DIRECTORY ${dir})
        get_filename_component(dir ${dir} ABSOLUTE)
        list(APPEND KOLO_TORCH_LINK_OPTIONS "-Wl,-rpath-link,${dir}")
      endif()
    endforeach()
    # Every target that links libtorch gets them through TORCH_LIBRARIES
    # (an item that starts with -Wl, is a linker flag there).
    list(APPEND TORCH_LIBRARIES ${KOLO_TORCH_LINK_OPTIONS})
    # One Gloo per lookup: a wheel's libtorch_cpu.so carries a Gloo of its own
    # and exports its symbols (gloo::rendezvous::Context::connectFullMesh ...),
    # while kolo's gloo backend is built against Debian's libgloo, a different
    # version. The dynamic linker binds each undefined symbol to the first
    # library of the lookup order that defines it, so libgloo must come before
    # libtorch_cpu in every program and in the Python extension, or kolo's
    # calls land in libtorch's Gloo with other class layouts (a SIGSEGV in
    # connectFullMesh). Listing it first in TORCH_LIBRARIES does that. In
    # Python, torch._C loads libtorch_cpu with RTLD_LOCAL, so torch.distributed's
    # ProcessGroupGloo keeps its own Gloo beside kolo's (tests/python/launch,
    # test_torchrun.py); a C++ program that links the wheel's libtorch has one
    # global lookup order, where c10d's ProcessGroupGloo would bind to
    # Debian's libgloo: there, use kolo's gloo backend or c10d's, not both
    # (docs/architecture.md). Debian's libtorch links Debian's libgloo itself.
    if(KOLO_HAVE_GLOO AND NOT KOLO_TORCH_IS_DEBIAN)
      get_target_property(_kolo_gloo_location gloo LOCATION)
      # (--no-as-needed: libtorch's targets turn --as-needed on, which would drop it.)
      list(PREPEND TORCH_LIBRARIES "-Wl,--no-as-needed,${_kolo_gloo_location}")
    endif()
  endif()
  # kolo::torch hands libtorch's imported targets on to whatever links it, so
  # an embedding project must see them: make them global (CMake >= 3.21).
  if(Torch_FOUND AND NOT KOLO_IS_TOP_LEVEL)
    if(CMAKE_VERSION VERSION_LESS 3.21)
      message(FATAL_ERROR "kolo: embedding kolo with its libtorch frontend needs CMake >= 3.21 "
                          "(or -DKOLO_WITH_TORCH=OFF)")
    endif()
    get_property(KOLO_TORCH_TARGETS DIRECTORY PROPERTY IMPORTED_TARGETS)
    if(KOLO_TARGETS_BEFORE_TORCH)
      list(REMOVE_ITEM KOLO_TORCH_TARGETS ${KOLO_TARGETS_BEFORE_TORCH})
    endif()
    foreach(target ${KOLO_TORCH_TARGETS})
      set_property(TARGET ${target} PROPERTY IMPORTED_GLOBAL TRUE)
    endforeach()
  endif()
endif()
if(KOLO_HAVE_TORCH)
  message(STATUS "kolo: libtorch frontend ON: libtorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}"
                 "${KOLO_TORCH_FROM}")
else()
  message(STATUS "kolo: libtorch frontend OFF")
endif()
