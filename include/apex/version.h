/* version.h: which apex this is, at compile time (the macros) and at run time (apex_version).
 *
 * A program compiled against one apex and run against another shared library can compare the two:
 * APEX_VERSION_STRING is the headers', apex_version() the library's. CMakeLists.txt reads its
 * project version from this file, so the two cannot drift apart. */
#ifndef APEX_VERSION_H
#define APEX_VERSION_H

#include "apex/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define APEX_VERSION_MAJOR 0
#define APEX_VERSION_MINOR 2
#define APEX_VERSION_PATCH 0
#define APEX_VERSION_STRING "0.2.0"
/* One number that orders versions: 10000 * major + 100 * minor + patch. */
#define APEX_VERSION_NUMBER (APEX_VERSION_MAJOR * 10000 + APEX_VERSION_MINOR * 100 + APEX_VERSION_PATCH)

/* The library's version as "MAJOR.MINOR.PATCH" (a static string; never NULL). */
APEX_API const char *apex_version(void);

#ifdef __cplusplus
}
#endif

#endif
