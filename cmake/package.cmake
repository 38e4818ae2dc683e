# Debian packages by CPack (`cpack -G DEB` in the build folder, or
# `cmake --build build --target package`), one per install component:
#   libkolo<soversion>  the shared libraries            (component Runtime)
#   libkolo-dev         headers, CMake package, .pc      (component Development)
#   kolo-tools          kolorun, kolo-bench, kolo-zero-consolidate (component Tools)
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

include(CPack)
