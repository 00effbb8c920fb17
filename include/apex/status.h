/* status.h: status codes and the thread-local error message.
 *
 * Every public apex function that can fail returns an apex_status (or NULL for constructors).
 * On failure it also leaves a message in a thread-local buffer that names what was wrong and,
 * where it can, what to do about it. The library never prints, exits or aborts on bad input:
 * the caller decides what to do with the status. */
#ifndef APEX_STATUS_H
#define APEX_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define APEX_API
#else
#define APEX_API __attribute__((visibility("default")))
#endif

typedef enum apex_status {
  APEX_OK = 0,
  APEX_ERR_INVALID_ARG,   /* an argument is out of range, NULL where it may not be, ... */
  APEX_ERR_OUT_OF_MEMORY, /* an allocation failed */
  APEX_ERR_SHAPE,         /* shapes or element counts do not match */
  APEX_ERR_DTYPE,         /* a dtype is not supported here or does not match */
  APEX_ERR_DEVICE,        /* the tensor lives on a device this call cannot use */
  APEX_ERR_IO,            /* a file could not be read or written */
  APEX_ERR_CORRUPT,       /* saved state or a file is truncated, corrupted or of another kind */
  APEX_ERR_STATE,         /* the call is not valid in the object's current state */
  APEX_ERR_UNSUPPORTED,   /* valid, but not built into this library (e.g. CUDA without a GPU) */
  APEX_ERR_NONFINITE,     /* a value that must be finite is not */
  APEX_ERR_SCALE_AT_MIN   /* kept for ABI; no longer returned: an overflow at the minimum loss scale is a
                             skipped step, reported by apex_loss_scaler_at_min / apex_amp_scale_at_min */
} apex_status;

/* The message left by the last failing apex call on this thread ("" if none yet). The pointer
 * stays valid until the next apex call on this thread. */
APEX_API const char *apex_last_error(void);

/* The status of the failure that left apex_last_error's message (APEX_OK if none yet): the code a
 * function that returns NULL on failure (an op, a create) failed with, e.g. APEX_ERR_SHAPE. */
APEX_API apex_status apex_last_status(void);

/* A short constant name for a status code, e.g. "APEX_ERR_SHAPE". */
APEX_API const char *apex_status_name(apex_status status);

/* Clears this thread's message and status. */
APEX_API void apex_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
