# Runs inside `cmake --install` (cmake/PmirrorInstall.cmake sets the
# PMIRROR_* variables): writes the files that name installed paths from the
# prefix of this install, CMAKE_INSTALL_PREFIX here being `--prefix` when
# given, and installs them (file(INSTALL) adds DESTDIR and records them in
# install_manifest.txt like any other file).

# DIR under the install prefix, unless it is absolute.
function(pmirror_installed_path out dir)
  if(IS_ABSOLUTE "${dir}")
    set(${out} "${dir}" PARENT_SCOPE)
  else()
    set(${out} "${CMAKE_INSTALL_PREFIX}/${dir}" PARENT_SCOPE)
  endif()
endfunction()

pmirror_installed_path(pmirror_sbindir "${PMIRROR_SBINDIR}")
pmirror_installed_path(pmirror_unitdir "${PMIRROR_UNIT_DIR}")
pmirror_installed_path(pmirror_libdir "${PMIRROR_LIBDIR}")
pmirror_installed_path(pmirror_includedir "${PMIRROR_INCLUDEDIR}")

# One folder per destination: installs into several prefixes may run at
# once from one build tree (the tests do).
string(MD5 pmirror_key "$ENV{DESTDIR}|${CMAKE_INSTALL_PREFIX}")
set(pmirror_out "${PMIRROR_BINARY_DIR}/install-time/${pmirror_key}")

# The unit's source says /usr/sbin/pmirrord: the binary under /usr.
file(READ "${PMIRROR_SOURCE_DIR}/systemd/pmirrord.service" pmirror_unit)
string(REPLACE "ExecStart=/usr/sbin/pmirrord " "ExecStart=${pmirror_sbindir}/pmirrord "
               pmirror_unit "${pmirror_unit}")
string(REPLACE "ExecReload=/usr/sbin/pmirrorctl " "ExecReload=${pmirror_sbindir}/pmirrorctl "
               pmirror_unit "${pmirror_unit}")
file(WRITE "${pmirror_out}/pmirrord.service" "${pmirror_unit}")
file(INSTALL DESTINATION "${pmirror_unitdir}" TYPE FILE FILES "${pmirror_out}/pmirrord.service")
file(READ "${PMIRROR_SOURCE_DIR}/systemd/pmirror-promoter.service" pmirror_unit)
string(REPLACE "ExecStart=/usr/sbin/pmirror-promoter " "ExecStart=${pmirror_sbindir}/pmirror-promoter "
               pmirror_unit "${pmirror_unit}")
file(WRITE "${pmirror_out}/pmirror-promoter.service" "${pmirror_unit}")
file(INSTALL DESTINATION "${pmirror_unitdir}" TYPE FILE FILES
     "${pmirror_out}/pmirror-promoter.service")

# libpmirror.pc, next to the library as pkg-config looks for it.
# PATH as ${prefix}/... when it lies under the prefix (as pkg-config
# files usually say), else as it is.
function(pmirror_pc_path out path)
  string(LENGTH "${CMAKE_INSTALL_PREFIX}/" length)
  string(SUBSTRING "${path}" 0 ${length} head)
  if(head STREQUAL "${CMAKE_INSTALL_PREFIX}/")
    string(SUBSTRING "${path}" ${length} -1 tail)
    set(${out} "\${prefix}/${tail}" PARENT_SCOPE)
  else()
    set(${out} "${path}" PARENT_SCOPE)
  endif()
endfunction()
set(prefix "${CMAKE_INSTALL_PREFIX}")
pmirror_pc_path(libdir "${pmirror_libdir}")
pmirror_pc_path(includedir "${pmirror_includedir}")
configure_file("${PMIRROR_SOURCE_DIR}/cmake/libpmirror.pc.in" "${pmirror_out}/libpmirror.pc" @ONLY)
file(INSTALL DESTINATION "${pmirror_libdir}/pkgconfig" TYPE FILE
     FILES "${pmirror_out}/libpmirror.pc")
