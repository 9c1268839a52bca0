# Install layout (Debian; configure with -DCMAKE_INSTALL_PREFIX=/usr for a
# package): binaries in sbin/ (daemon/CMakeLists.txt), libpmirror in
# lib/<multiarch>/ and its header in include/pmirror/ (lib/initiator), and
# here the systemd unit, the tmpfiles.d entry, the documentation and the
# example configuration.
set(PMIRROR_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
    "where the systemd unit goes, relative to the prefix")
set(PMIRROR_TMPFILES_DIR "lib/tmpfiles.d" CACHE STRING
    "where the tmpfiles.d entry goes, relative to the prefix")

# The unit names the installed pmirrord and docs: /usr/sbin/pmirrord and
# /usr/share/doc/pmirror under the /usr prefix, as in the source file.
file(READ ${PROJECT_SOURCE_DIR}/systemd/pmirrord.service pmirror_unit)
string(REPLACE "/usr/sbin/pmirrord" "${CMAKE_INSTALL_FULL_SBINDIR}/pmirrord" pmirror_unit
               "${pmirror_unit}")
string(REPLACE "/usr/share/doc/pmirror" "${CMAKE_INSTALL_FULL_DOCDIR}" pmirror_unit
               "${pmirror_unit}")
file(WRITE ${PROJECT_BINARY_DIR}/systemd/pmirrord.service.new "${pmirror_unit}")
configure_file(${PROJECT_BINARY_DIR}/systemd/pmirrord.service.new
               ${PROJECT_BINARY_DIR}/systemd/pmirrord.service COPYONLY)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${PROJECT_SOURCE_DIR}/systemd/pmirrord.service)

install(FILES ${PROJECT_BINARY_DIR}/systemd/pmirrord.service
        DESTINATION ${PMIRROR_SYSTEMD_UNIT_DIR})
install(FILES ${PROJECT_SOURCE_DIR}/systemd/pmirror.conf DESTINATION ${PMIRROR_TMPFILES_DIR})

# Read at install time, so documents added later need no reconfigure.
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}
        FILES_MATCHING PATTERN "*.md")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/config/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples
        FILES_MATCHING PATTERN "*.yaml")
