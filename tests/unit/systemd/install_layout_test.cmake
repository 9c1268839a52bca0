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
    include/pmirror/pmirror.h
    lib/systemd/system/pmirrord.service
    lib/tmpfiles.d/pmirror.conf
    share/doc/pmirror/README.md
    share/doc/pmirror/operations.md)
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
file(READ ${PREFIX}/lib/systemd/system/pmirrord.service unit)
if(NOT unit MATCHES "\nExecStart=/[^\n]*/sbin/pmirrord --config /etc/pmirror/cluster.yaml\n")
  message(FATAL_ERROR "the installed unit's ExecStart= is wrong:\n${unit}")
endif()
file(REMOVE_RECURSE ${PREFIX})
message(STATUS "install layout OK: ${expected}")
