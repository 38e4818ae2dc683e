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
  set_property(TARGET kolo_torch PROPERTY INSTALL_RPATH "$ORIGIN")  # finds libkolo_core beside it
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
    set_property(TARGET ${tool} PROPERTY INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Tools)
  endif()
endforeach()

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
  string(STRIP "${KOLO_PC_TORCH_CFLAGS}" KOLO_PC_TORCH_CFLAGS)
  string(STRIP "${KOLO_PC_TORCH_LIBS}" KOLO_PC_TORCH_LIBS)
  configure_file(cmake/kolo-torch.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/kolo-torch.pc @ONLY)
  list(APPEND KOLO_PC_FILES ${PROJECT_BINARY_DIR}/pkgconfig/kolo-torch.pc)
endif()
install(FILES ${KOLO_PC_FILES} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT Development)
