/* status.c: the thread-local error message behind apex_last_error(). */
#include <stdarg.h>
#include <stdio.h>

#include "core/internal.h"

#define APEX_ERROR_CAPACITY 1024
static _Thread_local char apex_error_message[APEX_ERROR_CAPACITY];
static _Thread_local apex_status apex_error_status = APEX_OK;
/* The failure a chain of NULL arguments began with (apex__fail_null_arg), kept apart so that each
 * call of the chain names itself and the root cause once, instead of nesting every message. */
static _Thread_local char apex_error_root[APEX_ERROR_CAPACITY];
static _Thread_local int apex_error_in_chain;
static _Thread_local char apex_error_own[128]; /* the last NULL's own words ("fn: NULL what") */

static void apex_set_message(apex_status status, const char *fmt, va_list ap) {
  vsnprintf(apex_error_message, sizeof apex_error_message, fmt, ap);
  apex_error_status = status;
  apex_error_in_chain = 0;
}

apex_status apex__fail(apex_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  apex_set_message(status, fmt, ap);
  va_end(ap);
  return status;
}

void *apex__fail_null(apex_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  apex_set_message(status, fmt, ap);
  va_end(ap);
  return NULL;
}

void apex__fail_null_arg(const char *fn, const char *what) {
  /* The first NULL of a chain takes the message before it as the chain's root; later ones keep it,
   * and name the call just before them by its own words only, so that the message stays short. */
  char prev[128];
  snprintf(prev, sizeof prev, "%s", apex_error_own);
  if (!apex_error_in_chain) snprintf(apex_error_root, sizeof apex_error_root, "%s", apex_error_message);
  if (apex_error_in_chain && apex_error_root[0])
    apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL %s (the last error before it: %s; the first: %s)", fn, what, prev, apex_error_root);
  else if (apex_error_root[0]) apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL %s (the last error before it: %s)", fn, what, apex_error_root);
  else apex__fail(APEX_ERR_INVALID_ARG, "%s: NULL %s", fn, what);
  snprintf(apex_error_own, sizeof apex_error_own, "%s: NULL %s", fn, what);
  apex_error_in_chain = 1;
}

const char *apex_last_error(void) { return apex_error_message; }

apex_status apex_last_status(void) { return apex_error_status; }

void apex_clear_error(void) {
  apex_error_message[0] = '\0';
  apex_error_root[0] = '\0';
  apex_error_own[0] = '\0';
  apex_error_in_chain = 0;
  apex_error_status = APEX_OK;
}

const char *apex_status_name(apex_status status) {
  switch (status) {
  case APEX_OK: return "APEX_OK";
  case APEX_ERR_INVALID_ARG: return "APEX_ERR_INVALID_ARG";
  case APEX_ERR_OUT_OF_MEMORY: return "APEX_ERR_OUT_OF_MEMORY";
  case APEX_ERR_SHAPE: return "APEX_ERR_SHAPE";
  case APEX_ERR_DTYPE: return "APEX_ERR_DTYPE";
  case APEX_ERR_DEVICE: return "APEX_ERR_DEVICE";
  case APEX_ERR_IO: return "APEX_ERR_IO";
  case APEX_ERR_CORRUPT: return "APEX_ERR_CORRUPT";
  case APEX_ERR_STATE: return "APEX_ERR_STATE";
  case APEX_ERR_UNSUPPORTED: return "APEX_ERR_UNSUPPORTED";
  case APEX_ERR_NONFINITE: return "APEX_ERR_NONFINITE";
  case APEX_ERR_SCALE_AT_MIN: return "APEX_ERR_SCALE_AT_MIN";
  }
  return "APEX_ERR_UNKNOWN";
}
