# How kolo's libraries are built (used by core/ and torch/).
#
# Each library is compiled once into an OBJECT library with hidden symbol
# visibility and linked into a shared library that exports exactly what its
# public headers declare (they wrap their declarations in
# `#pragma GCC visibility push(default)` ... `pop`; cmake/kolo.map keeps the
# library's template instantiations of other namespaces local). Programs that use internal
# headers link a static archive of the same objects instead (kolo_*_internal),
# never both in one process.

# While the major version is 0 every minor release may change the ABI, so the
# soname carries MAJOR.MINOR (libkolo_core.so.0.2); from 1.0 on, MAJOR alone.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(KOLO_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
else()
  set(KOLO_SOVERSION ${PROJECT_VERSION_MAJOR})
endif()

# kolo_library_objects(<objects>): compile settings of a library's objects.
function(kolo_library_objects objects)
  set_target_properties(${objects} PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_compile_definitions(${objects} PRIVATE KOLO_BUILDING_LIBRARY=1)
endfunction()

# kolo_shared_library(<target> <export name> <objects> <headers>): makes
# <target> (already added as SHARED) the installable library kolo::<export
# name> from <objects>, with the include folders of the INTERFACE target
# <headers> in the build tree and include/ once installed.
function(kolo_shared_library target export_name objects headers)
  target_link_libraries(${target} PRIVATE ${objects} PUBLIC $<BUILD_INTERFACE:${headers}>)
  target_include_directories(${target} INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${target} INTERFACE cxx_std_17)
  target_link_options(${target} PRIVATE "-Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/kolo.map")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/kolo.map)
  set_target_properties(${target} PROPERTIES
    VERSION ${PROJECT_VERSION}
    SOVERSION ${KOLO_SOVERSION}
    EXPORT_NAME ${export_name}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  add_library(kolo::${export_name} ALIAS ${target})
endfunction()

# kolo_check_public_headers(<dir>): every header under <dir> that declares
# something in namespace kolo must export it (see above); a header without the
# pragmas would make its declarations hidden, and programs would fail to link
# with "undefined reference" to them.
function(kolo_check_public_headers dir)
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS ${dir}/*.h)
  foreach(header ${headers})
    file(READ ${header} text)
    if(text MATCHES "namespace kolo" AND NOT (text MATCHES "#pragma GCC visibility push\\(default\\)"
                                              AND text MATCHES "#pragma GCC visibility pop"))
      message(FATAL_ERROR "kolo: public header ${header} declares kolo API but does not export "
                          "it: put `#pragma GCC visibility push(default)` after its #includes and "
                          "`#pragma GCC visibility pop` at its end (cmake/kolo_targets.cmake)")
    endif()
  endforeach()
endfunction()
