# Debian packages by CPack (`cpack -G DEB` in the build folder, or
# `cmake --build build --target package`), one per install component:
#   libkolo<soversion>  the shared libraries            (component Runtime)
#   libkolo-dev         headers, CMake package, .pc      (component Development)
#   kolo-tools          kolorun, kolo-bench, kolo-zero-consolidate (component Tools)
#   python3-kolo        the Python frontend, kolo.torch     (component Python,
#                       when it is built: KOLO_HAVE_PYTHON)
# Depends on Debian's own packages: dpkg-shlibdeps derives the libraries'
# (libtorch1.13, libgloo0, libopenmpi3, libc6 ...) from the binaries; the
# development package adds what kolo's CMake package needs at build time of a
# consumer (libtorch-dev for find_dependency(Torch)).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kolo)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_CONTACT "kolo developers <kolo@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL Runtime Development Tools)
if(TARGET kolo_python_extension)
  list(APPEND CPACK_COMPONENTS_ALL Python)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# kolo-bench links libkolo_core/libkolo_torch of this build: let dpkg-shlibdeps
# find them (the dependency on libkolo comes from the component's DEPENDS).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/core ${PROJECT_BINARY_DIR}/torch)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libkolo${KOLO_SOVERSION})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION "kolo's shared libraries: libkolo_core and libkolo_torch")

set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_NAME libkolo-dev)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEVELOPMENT_DESCRIPTION
    "kolo's headers, CMake package (find_package(kolo)) and pkg-config files")
set(CPACK_COMPONENT_DEVELOPMENT_DEPENDS Runtime)
if(KOLO_HAVE_TORCH)
  set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_DEPENDS "libtorch-dev")
endif()

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME kolo-tools)
set(CPACK_COMPONENT_TOOLS_DESCRIPTION "kolorun (kolo's launcher), kolo-bench, kolo-zero-consolidate")
set(CPACK_COMPONENT_TOOLS_DEPENDS Runtime)
# kolorun --backend mpi runs mpirun; kolo-bench scaling --plot runs gnuplot.
set(CPACK_DEBIAN_TOOLS_PACKAGE_RECOMMENDS "openmpi-bin")
set(CPACK_DEBIAN_TOOLS_PACKAGE_SUGGESTS "gnuplot-nox")

# The extension links libkolo_torch and Debian's libtorch_python (libtorch1.13,
# found by dpkg-shlibdeps); `import torch` needs Debian's python3-torch, whose
# interpreter is python3 (cmake/KoloPython.cmake, cmake/install.cmake put the
# package into /usr/lib/python3/dist-packages).
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-kolo)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_COMPONENT_PYTHON_DESCRIPTION
    "kolo's Python frontend: import kolo.torch as hvd (Horovod's PyTorch API on kolo's engine)")
set(CPACK_COMPONENT_PYTHON_DEPENDS Runtime)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3, python3-torch")
set(CPACK_DEBIAN_PYTHON_PACKAGE_RECOMMENDS "kolo-tools")

include(CPack)
