# Install layout (Debian; configure with -DCMAKE_INSTALL_PREFIX=/usr for a
# package, as debian/rules does): binaries in sbin/ (daemon/CMakeLists.txt),
# libpmirror in lib/<multiarch>/ (lib/initiator), and here its public
# headers (the source's include/pmirror/, as include/pmirror/), libpmirror.pc
# and the CMake package (pmirror::pmirror), the systemd unit, the tmpfiles.d
# entry, the man pages (man/), the bash completion (completion/), the
# documentation and the example configuration. docs/packaging.md lists it.
include(CMakePackageConfigHelpers)
set(PMIRROR_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
    "where the systemd unit goes, relative to the prefix")
set(PMIRROR_TMPFILES_DIR "lib/tmpfiles.d" CACHE STRING
    "where the tmpfiles.d entry goes, relative to the prefix")
set(PMIRROR_OCF_AGENT_DIR "lib/ocf/resource.d/pmirror" CACHE STRING
    "where the Pacemaker resource agent goes, relative to the prefix (OCF_ROOT is /usr/lib/ocf)")
set(PMIRROR_CMAKE_PACKAGE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/pmirror" CACHE STRING
    "where pmirrorConfig.cmake goes, relative to the prefix")

# libpmirror's API, C and C++: every header there and nothing else
# (tests/external builds programs against the installed tree alone).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/pmirror DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")

# find_package(pmirror) -> pmirror::pmirror. The targets file finds its
# prefix from where it lies, so it is right under any --prefix or DESTDIR.
install(EXPORT pmirrorTargets NAMESPACE pmirror:: DESTINATION ${PMIRROR_CMAKE_PACKAGE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pmirrorConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cmake/pmirrorConfig.cmake
                              INSTALL_DESTINATION ${PMIRROR_CMAKE_PACKAGE_DIR})
# The soname (libpmirror.so.0) changes with the major version only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/pmirrorConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/pmirrorConfig.cmake
              ${PROJECT_BINARY_DIR}/cmake/pmirrorConfigVersion.cmake
        DESTINATION ${PMIRROR_CMAKE_PACKAGE_DIR})

# The unit (ExecStart=) and libpmirror.pc (prefix=) name installed paths.
# They are written while installing, from the prefix of that install
# (`cmake --install build --prefix /usr` after a configure for /usr/local
# must give /usr/sbin/pmirrord), by cmake/PmirrorInstallTime.cmake.
install(CODE "
  set(PMIRROR_SOURCE_DIR [[${PROJECT_SOURCE_DIR}]])
  set(PMIRROR_BINARY_DIR [[${PROJECT_BINARY_DIR}]])
  set(PMIRROR_VERSION [[${PROJECT_VERSION}]])
  set(PMIRROR_SBINDIR [[${CMAKE_INSTALL_SBINDIR}]])
  set(PMIRROR_LIBDIR [[${CMAKE_INSTALL_LIBDIR}]])
  set(PMIRROR_INCLUDEDIR [[${CMAKE_INSTALL_INCLUDEDIR}]])
  set(PMIRROR_UNIT_DIR [[${PMIRROR_SYSTEMD_UNIT_DIR}]])
  include([[${PROJECT_SOURCE_DIR}/cmake/PmirrorInstallTime.cmake]])
")
install(FILES ${PROJECT_SOURCE_DIR}/systemd/pmirror.conf DESTINATION ${PMIRROR_TMPFILES_DIR})

# ocf:pmirror:pmirror, the Pacemaker resource agent (docs/failover.md).
install(PROGRAMS ${PROJECT_SOURCE_DIR}/ocf/pmirror DESTINATION ${PMIRROR_OCF_AGENT_DIR})

# bash-completion loads completions/<command> on first use.
install(FILES ${PROJECT_SOURCE_DIR}/completion/pmirrorctl.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME pmirrorctl)

# Man pages, generated from man/*.scd (scdoc).
add_subdirectory(${PROJECT_SOURCE_DIR}/man ${PROJECT_BINARY_DIR}/man)

# Read at install time, so documents added later need no reconfigure.
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}
        FILES_MATCHING PATTERN "*.md")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/config/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples
        FILES_MATCHING PATTERN "*.yaml")
