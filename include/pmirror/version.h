/* The version of the pmirror headers an application compiles against;
 * pmirror_version() (pmirror.h) gives the library's at run time. The build
 * reads its project version from here (CMakeLists.txt), so this is the one
 * place to change it. The soname (libpmirror.so.0, lib/initiator) changes
 * only when the C ABI breaks. */
#ifndef PMIRROR_VERSION_H
#define PMIRROR_VERSION_H

#define PMIRROR_VERSION_MAJOR 0
#define PMIRROR_VERSION_MINOR 1
#define PMIRROR_VERSION_PATCH 0

#endif /* PMIRROR_VERSION_H */
