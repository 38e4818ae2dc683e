# Finds what the Python frontend (python/, module kolo.torch) needs and sets
# KOLO_HAVE_PYTHON. Built with the libtorch frontend when KOLO_PYTHON can
# import torch and pybind11-dev and python3-dev are installed (scripts/setup.sh).
#
# KOLO_PYTHON defaults to Debian's /usr/bin/python3: python3-torch installs
# torch for it alone, and a python3 earlier on PATH (pyenv, a venv) usually
# cannot import it. The extension must be built for the interpreter whose
# torch it links against, so FindPython3 is pointed at the same one.
set(KOLO_PYTHON /usr/bin/python3 CACHE FILEPATH
    "Python interpreter of the kolo.torch module (it must import Debian's torch)")
set(KOLO_HAVE_PYTHON OFF)
set(_kolo_python_why "")
if(NOT KOLO_HAVE_TORCH)
  set(_kolo_python_why "no libtorch")
elseif(NOT EXISTS ${KOLO_PYTHON})
  set(_kolo_python_why "${KOLO_PYTHON} not found")
else()
  # From "/": a directory named torch/ in the working directory (this
  # repository has one) would shadow the package.
  execute_process(
    COMMAND ${KOLO_PYTHON} -c
      "import torch; c = torch._C; print(c._PYBIND11_COMPILER_TYPE, c._PYBIND11_STDLIB, c._PYBIND11_BUILD_ABI, torch.__version__)"
    WORKING_DIRECTORY /
    RESULT_VARIABLE _kolo_python_result
    OUTPUT_VARIABLE _kolo_python_torch
    ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _kolo_python_result EQUAL 0)
    set(_kolo_python_why "${KOLO_PYTHON} cannot import torch (apt-get install python3-torch)")
  else()
    separate_arguments(_kolo_python_torch)
    list(GET _kolo_python_torch 0 KOLO_TORCH_PYBIND11_COMPILER_TYPE)
    list(GET _kolo_python_torch 1 KOLO_TORCH_PYBIND11_STDLIB)
    list(GET _kolo_python_torch 2 KOLO_TORCH_PYBIND11_BUILD_ABI)
    list(GET _kolo_python_torch 3 KOLO_PYTHON_TORCH_VERSION)
    set(Python3_EXECUTABLE ${KOLO_PYTHON})
    find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
    find_package(pybind11 CONFIG QUIET)
    find_library(KOLO_TORCH_PYTHON_LIBRARY torch_python PATHS "${TORCH_INSTALL_PREFIX}/lib")
    if(NOT Python3_Development.Module_FOUND)
      set(_kolo_python_why "no Python headers (apt-get install python3-dev)")
    elseif(NOT pybind11_FOUND)
      set(_kolo_python_why "no pybind11 (apt-get install pybind11-dev)")
    elseif(NOT KOLO_TORCH_PYTHON_LIBRARY)
      set(_kolo_python_why "no libtorch_python.so (apt-get install libtorch-dev)")
    else()
      set(KOLO_HAVE_PYTHON ON)
      set(_kolo_python_why "${KOLO_PYTHON}, Python ${Python3_VERSION}, torch ${KOLO_PYTHON_TORCH_VERSION}")
    endif()
  endif()
endif()
message(STATUS "kolo: python frontend ${KOLO_HAVE_PYTHON} (${_kolo_python_why})")
