# Install rules: `cmake --install build --prefix P` gives P with
#   lib/libkolo_core.so.0.2.0 (+ libkolo_torch)        component Runtime
#   include/kolo/... (public headers, version.h)      component Development
#   lib/cmake/kolo/kolo-config.cmake, -version, targets component Development
#   bin/kolorun, kolo-bench, kolo-zero-consolidate    component Tools
# and `find_package(kolo 0.2 CONFIG REQUIRED)` in a consumer gives kolo::core
# and, when libtorch was found at build time, kolo::torch (component torch).
include(CMakePackageConfigHelpers)

set(KOLO_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kolo)


install(TARGETS kolo_core EXPORT kolo-core-targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Runtime
                NAMELINK_COMPONENT Development)
install(DIRECTORY core/include/ ${PROJECT_BINARY_DIR}/core/include/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT Development
        FILES_MATCHING PATTERN "*.h")
install(EXPORT kolo-core-targets NAMESPACE kolo:: DESTINATION ${KOLO_INSTALL_CMAKEDIR}
        COMPONENT Development)

if(TARGET kolo_torch)
  # libkolo_core beside it, and a wheel's libtorch where it is (KoloTorch.cmake).
  set_property(TARGET kolo_torch PROPERTY INSTALL_RPATH "$ORIGIN" ${KOLO_TORCH_RUNPATH})
  install(TARGETS kolo_torch EXPORT kolo-torch-targets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Runtime
                  NAMELINK_COMPONENT Development)
  install(DIRECTORY torch/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT Development
          FILES_MATCHING PATTERN "*.h")
  install(EXPORT kolo-torch-targets NAMESPACE kolo:: DESTINATION ${KOLO_INSTALL_CMAKEDIR}
          COMPONENT Development)
endif()

foreach(tool kolorun kolo-bench kolo-zero-consolidate)
  if(TARGET ${tool})
    set_property(TARGET ${tool} PROPERTY INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}"
                                                       ${KOLO_TORCH_RUNPATH})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Tools)
  endif()
endforeach()

# kolo.torch (python/): the package and its extension into the interpreter's
# site-packages for the prefix, component Python (the python3-kolo Debian package).
if(TARGET kolo_python_extension)
  # KOLO_PYTHON_INSTALL_DIR (relative to the install prefix) defaults to where
  # KOLO_PYTHON looks for that prefix: Debian's lib/python3/dist-packages for
  # /usr (the .deb), lib/python3.X/dist-packages for /usr/local, and
  # lib/python3.X/site-packages elsewhere (add it to PYTHONPATH).
  if(NOT KOLO_PYTHON_INSTALL_DIR)
    execute_process(
      COMMAND ${KOLO_PYTHON} -c [=[
import sys, sysconfig
prefix = sys.argv[1].rstrip("/") or "/"
version = "%d.%d" % sys.version_info[:2]
if prefix == "/usr" and "deb_system" in sysconfig.get_scheme_names():
    print("lib/python3/dist-packages")
elif prefix == "/usr/local" and "posix_local" in sysconfig.get_scheme_names():
    print("lib/python%s/dist-packages" % version)
else:
    print("lib/python%s/site-packages" % version)
]=] ${CMAKE_INSTALL_PREFIX}
      WORKING_DIRECTORY /
      OUTPUT_VARIABLE KOLO_PYTHON_INSTALL_DIR_DEFAULT
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    set(KOLO_PYTHON_INSTALL_DIR ${KOLO_PYTHON_INSTALL_DIR_DEFAULT} CACHE STRING
        "Where cmake --install puts the kolo package, relative to the install prefix")
  endif()
  # The extension finds libkolo_torch and libkolo_core relative to itself.
  file(RELATIVE_PATH KOLO_PYTHON_TO_LIBDIR
       /prefix/${KOLO_PYTHON_INSTALL_DIR}/kolo /prefix/${CMAKE_INSTALL_LIBDIR})
  set_property(TARGET kolo_python_extension PROPERTY
    INSTALL_RPATH "$ORIGIN/${KOLO_PYTHON_TO_LIBDIR}" ${KOLO_TORCH_RUNPATH})
  install(TARGETS kolo_python_extension
          LIBRARY DESTINATION ${KOLO_PYTHON_INSTALL_DIR}/kolo COMPONENT Python)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/kolo DESTINATION ${KOLO_PYTHON_INSTALL_DIR}
          COMPONENT Python FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
  install(FILES ${PROJECT_BINARY_DIR}/python/kolo/_build.py
          DESTINATION ${KOLO_PYTHON_INSTALL_DIR}/kolo COMPONENT Python)
endif()

configure_package_config_file(cmake/kolo-config.cmake.in
  ${PROJECT_BINARY_DIR}/kolo-config.cmake INSTALL_DESTINATION ${KOLO_INSTALL_CMAKEDIR})
# 0.x: a minor release may change the API, so 0.2 accepts 0.2.* only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kolo-config-version.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kolo-config.cmake ${PROJECT_BINARY_DIR}/kolo-config-version.cmake
        DESTINATION ${KOLO_INSTALL_CMAKEDIR} COMPONENT Development)

# pkg-config: kolo.pc (core) and kolo-torch.pc, relocatable (${pcfiledir}).
file(RELATIVE_PATH KOLO_PC_RELATIVE_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(cmake/kolo.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/kolo.pc @ONLY)
set(KOLO_PC_FILES ${PROJECT_BINARY_DIR}/pkgconfig/kolo.pc)
if(TARGET kolo_torch)
  # libtorch's flags as its CMake package gives them: include folders outside
  # the compiler's default ones, the ABI definition, and its libraries.
  set(KOLO_PC_TORCH_CFLAGS ${TORCH_CXX_FLAGS})
  # libtorch 2.x's headers need C++20 (its CMake target says cxx_std_20).
  get_target_property(torch_features torch INTERFACE_COMPILE_FEATURES)
  if(torch_features AND "cxx_std_20" IN_LIST torch_features)
    string(APPEND KOLO_PC_TORCH_CFLAGS " -std=c++20")
  endif()
  foreach(dir ${TORCH_INCLUDE_DIRS})
    if(NOT dir IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
      string(APPEND KOLO_PC_TORCH_CFLAGS " -I${dir}")
    endif()
  endforeach()
  set(KOLO_PC_TORCH_LIBS "")
  foreach(lib torch torch_cpu c10)
    set(location "")
    if(TARGET ${lib})
      get_target_property(configs ${lib} IMPORTED_CONFIGURATIONS)
      foreach(config ${configs})
        get_target_property(location ${lib} IMPORTED_LOCATION_${config})
        break()
      endforeach()
    else()
      find_library(location NAMES ${lib} HINTS ${TORCH_INSTALL_PREFIX}/lib NO_CACHE)
    endif()
    if(NOT location)
      message(FATAL_ERROR "kolo: libtorch's library ${lib} not found for kolo-torch.pc")
    endif()
    get_filename_component(dir ${location} DIRECTORY)
    if(NOT dir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
      string(APPEND KOLO_PC_TORCH_LIBS " -L${dir}")
    endif()
    string(APPEND KOLO_PC_TORCH_LIBS " -l${lib}")
  endforeach()
  foreach(option ${KOLO_TORCH_LINK_OPTIONS})  # the wheel's NCCL (KoloTorch.cmake)
    string(APPEND KOLO_PC_TORCH_LIBS " ${option}")
  endforeach()
  string(STRIP "${KOLO_PC_TORCH_CFLAGS}" KOLO_PC_TORCH_CFLAGS)
  string(STRIP "${KOLO_PC_TORCH_LIBS}" KOLO_PC_TORCH_LIBS)
  configure_file(cmake/kolo-torch.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/kolo-torch.pc @ONLY)
  list(APPEND KOLO_PC_FILES ${PROJECT_BINARY_DIR}/pkgconfig/kolo-torch.pc)
endif()
install(FILES ${KOLO_PC_FILES} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT Development)
