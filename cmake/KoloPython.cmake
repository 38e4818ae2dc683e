# Finds what the Python frontend (python/, module kolo.torch) needs and sets
# KOLO_HAVE_PYTHON. Built with the libtorch frontend when KOLO_PYTHON (cache
# variable of cmake/KoloTorch.cmake: the project's .venv, else Debian's
# /usr/bin/python3) imports the same torch whose libtorch the build found, and
# that interpreter's headers are there.
#
# The extension is built for that interpreter and that torch alone, and links
# the libtorch_python.so that sits beside the libtorch found (never another
# one on the system's library path: one process maps one libtorch). pybind11
# comes from torch's own include folder (the wheel bundles the headers its
# torch._C was built with; Debian's torch uses pybind11-dev's in /usr/include),
# so that kolo's bindings and torch's share one pybind11 type registry.
set(KOLO_HAVE_PYTHON OFF)
set(_kolo_python_why "")
if(NOT KOLO_HAVE_TORCH)
  set(_kolo_python_why "no libtorch")
elseif(NOT EXISTS ${KOLO_PYTHON})
  set(_kolo_python_why "${KOLO_PYTHON} not found (bash scripts/setup.sh makes .venv)")
else()
  # From "/": a directory named torch/ in the working directory (this
  # repository has one) would shadow the package. torch before 2.x names the
  # pybind11 ABI it was built with; later pybind11 derives it by itself.
  execute_process(
    COMMAND ${KOLO_PYTHON} -c
      "import torch; c = torch._C; print(torch.__version__.split('+')[0], *(getattr(c, '_PYBIND11_' + k, '-') for k in ('COMPILER_TYPE', 'STDLIB', 'BUILD_ABI')))"
    WORKING_DIRECTORY /
    RESULT_VARIABLE _kolo_python_result
    OUTPUT_VARIABLE _kolo_python_torch
    ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _kolo_python_result EQUAL 0)
    set(_kolo_python_why "${KOLO_PYTHON} cannot import torch (bash scripts/setup.sh installs it into .venv)")
  else()
    separate_arguments(_kolo_python_torch)
    list(GET _kolo_python_torch 0 KOLO_PYTHON_TORCH_VERSION)
    list(GET _kolo_python_torch 1 KOLO_TORCH_PYBIND11_COMPILER_TYPE)
    list(GET _kolo_python_torch 2 KOLO_TORCH_PYBIND11_STDLIB)
    list(GET _kolo_python_torch 3 KOLO_TORCH_PYBIND11_BUILD_ABI)
    set(Python3_EXECUTABLE ${KOLO_PYTHON})
    find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
    find_library(KOLO_TORCH_PYTHON_LIBRARY torch_python PATHS "${KOLO_TORCH_LIB_DIR}"
                 NO_DEFAULT_PATH)
    if(NOT KOLO_PYTHON_TORCH_VERSION VERSION_EQUAL Torch_VERSION)
      set(_kolo_python_why "${KOLO_PYTHON} imports torch ${KOLO_PYTHON_TORCH_VERSION}, the build "
                           "found libtorch ${Torch_VERSION}; set -DKOLO_PYTHON to the interpreter "
                           "of that libtorch")
    elseif(NOT Python3_Development.Module_FOUND)
      set(_kolo_python_why "no Python headers for ${KOLO_PYTHON} (apt-get install python3-dev)")
    elseif(NOT EXISTS ${KOLO_TORCH_LIB_DIR}/../include/pybind11/pybind11.h
           AND NOT EXISTS /usr/include/pybind11/pybind11.h)
      set(_kolo_python_why "no pybind11 headers (apt-get install pybind11-dev)")
    elseif(NOT KOLO_TORCH_PYTHON_LIBRARY)
      set(_kolo_python_why "no libtorch_python.so in ${KOLO_TORCH_LIB_DIR}")
    else()
      set(KOLO_HAVE_PYTHON ON)
      set(_kolo_python_why "${KOLO_PYTHON}, Python ${Python3_VERSION}, torch ${KOLO_PYTHON_TORCH_VERSION}")
    endif()
  endif()
endif()
message(STATUS "kolo: python frontend ${KOLO_HAVE_PYTHON} (${_kolo_python_why})")
