# cmake -DBUILD_DIR= -DPREFIX= -DLIBDIR= -DSOURCE_DIR= -P install_layout_test.cmake
# Installs the build into a fresh PREFIX and checks the Debian layout.
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc}):\n${out}")
endif()

set(expected
    sbin/pmirrord
    ${LIBDIR}/libpmirror.so
    ${LIBDIR}/pkgconfig/libpmirror.pc
    ${LIBDIR}/cmake/pmirror/pmirrorConfig.cmake
    ${LIBDIR}/cmake/pmirror/pmirrorConfigVersion.cmake
    ${LIBDIR}/cmake/pmirror/pmirrorTargets.cmake
    include/pmirror/pmirror.h
    lib/systemd/system/pmirrord.service
    lib/tmpfiles.d/pmirror.conf
    share/bash-completion/completions/pmirrorctl
    share/doc/pmirror/README.md
    share/doc/pmirror/operations.md)
# The man pages, when scdoc built them (man/CMakeLists.txt).
if(EXISTS ${BUILD_DIR}/man/pmirrord.8)
  list(APPEND expected share/man/man8/pmirrord.8 share/man/man8/pmirrorctl.8
       share/man/man5/pmirror-cluster.yaml.5 share/man/man3/libpmirror.3
       share/man/man3/pmirror_persist.3 share/man/man3/pmirror_wait.3)
endif()
if(EXISTS ${BUILD_DIR}/daemon/pmirrorctl)
  list(APPEND expected sbin/pmirrorctl)
endif()
file(GLOB docs RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/docs/*.md)
foreach(doc IN LISTS docs)
  get_filename_component(name ${doc} NAME)
  list(APPEND expected share/doc/pmirror/${name})
endforeach()
file(GLOB examples RELATIVE ${SOURCE_DIR}/config ${SOURCE_DIR}/config/*.yaml)
if(NOT examples)
  message(FATAL_ERROR "no config/*.yaml to install as examples")
endif()
foreach(example IN LISTS examples)
  list(APPEND expected share/doc/pmirror/examples/${example})
endforeach()

set(missing "")
foreach(file IN LISTS expected)
  if(NOT EXISTS ${PREFIX}/${file})
    string(APPEND missing "  ${file}\n")
  endif()
endforeach()
if(missing)
  file(GLOB_RECURSE installed RELATIVE ${PREFIX} ${PREFIX}/*)
  string(REPLACE ";" "\n  " installed "${installed}")
  message(FATAL_ERROR "not installed:\n${missing}installed:\n  ${installed}")
endif()

execute_process(COMMAND ${PREFIX}/sbin/pmirrord --version RESULT_VARIABLE rc
                OUTPUT_VARIABLE version ERROR_VARIABLE version)
if(NOT rc EQUAL 0 OR NOT version MATCHES "pmirrord")
  message(FATAL_ERROR "the installed sbin/pmirrord does not run (${rc}): ${version}")
endif()
execute_process(COMMAND ${PREFIX}/sbin/pmirrorctl --version RESULT_VARIABLE rc
                OUTPUT_VARIABLE version ERROR_VARIABLE version)
if(NOT rc EQUAL 0 OR NOT version MATCHES "^pmirrorctl [0-9]+\\.[0-9]+\\.[0-9]+\n$")
  message(FATAL_ERROR "pmirrorctl --version exits ${rc} saying: ${version}")
endif()

# The unit names the pmirrord of this install: the build was configured for
# another prefix (CMAKE_INSTALL_PREFIX), so a path filled in at configure
# time would name that one.
file(READ ${PREFIX}/lib/systemd/system/pmirrord.service unit)
string(FIND "${unit}" "\nExecStart=${PREFIX}/sbin/pmirrord --config /etc/pmirror/cluster.yaml\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the installed unit's ExecStart= is not ${PREFIX}/sbin/pmirrord:\n${unit}")
endif()
string(FIND "${unit}" "\nExecReload=${PREFIX}/sbin/pmirrorctl reload\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the installed unit's ExecReload= is not ${PREFIX}/sbin/pmirrorctl:\n${unit}")
endif()
# systemd-analyze checks that ExecStart= exists and, with MANPATH, that the
# Documentation= man pages are installed.
find_program(analyze systemd-analyze)
if(analyze AND EXISTS ${BUILD_DIR}/man/pmirrord.8)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env MANPATH=${PREFIX}/share/man
                          ${analyze} verify ${PREFIX}/lib/systemd/system/pmirrord.service
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0 OR NOT out STREQUAL "")
    message(FATAL_ERROR "systemd-analyze verify on the installed unit (${rc}):\n${out}")
  endif()
else()
  message(STATUS "systemd-analyze or the man pages (scdoc) missing: installed unit not verified")
endif()

# pkg-config and find_package(pmirror) find the library of this install.
file(READ ${PREFIX}/${LIBDIR}/pkgconfig/libpmirror.pc pc)
string(FIND "${pc}" "prefix=${PREFIX}\n" prefix_at)
string(FIND "${pc}" "\nlibdir=\${prefix}/${LIBDIR}\n" libdir_at)
if(NOT prefix_at EQUAL 0 OR libdir_at EQUAL -1)
  message(FATAL_ERROR "libpmirror.pc does not name ${PREFIX}:\n${pc}")
endif()
find_program(pkg_config pkg-config)
if(pkg_config)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${PREFIX}/${LIBDIR}/pkgconfig
                          ${pkg_config} --cflags --libs libpmirror
                  RESULT_VARIABLE rc OUTPUT_VARIABLE flags ERROR_VARIABLE flags)
  string(STRIP "${flags}" flags)
  if(NOT rc EQUAL 0 OR NOT flags STREQUAL "-I${PREFIX}/include -L${PREFIX}/${LIBDIR} -lpmirror")
    message(FATAL_ERROR "pkg-config --cflags --libs libpmirror (${rc}): ${flags}")
  endif()
endif()
include(${PREFIX}/${LIBDIR}/cmake/pmirror/pmirrorConfigVersion.cmake)
if(NOT PACKAGE_VERSION MATCHES "^[0-9]+\\.[0-9]+\\.[0-9]+$")
  message(FATAL_ERROR "pmirrorConfigVersion.cmake gives no version: '${PACKAGE_VERSION}'")
endif()
file(REMOVE_RECURSE ${PREFIX})
message(STATUS "install layout OK: ${expected}")
