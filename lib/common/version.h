// pmirror's version as text ("MAJOR.MINOR.PATCH"), from the public header
// (<pmirror/version.h>) so that it is written once: --version, status's
// "version", pmirror_version_string().
#pragma once

#include <pmirror/version.h>

#define PMIRROR_STRINGIFY_(x) #x
#define PMIRROR_STRINGIFY(x) PMIRROR_STRINGIFY_(x)
#define PMIRROR_VERSION_STRING             \
  PMIRROR_STRINGIFY(PMIRROR_VERSION_MAJOR) \
  "." PMIRROR_STRINGIFY(PMIRROR_VERSION_MINOR) "." PMIRROR_STRINGIFY(PMIRROR_VERSION_PATCH)
