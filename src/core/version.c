/* version.c: the version of the library that is linked (apex_version), as opposed to the headers'. */
#include "apex/version.h"

const char *apex_version(void) { return APEX_VERSION_STRING; }
