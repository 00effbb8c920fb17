/* loss_scaler_config.h: a loss scaler's configuration and saved state (apex_loss_scaler_config,
 * apex_loss_scaler_state), the types that both the scaler (loss_scaler.h) and the backends' scale-update
 * kernels take. They sit in a header of their own, below loss_scaler.h, so that a backend can apply the
 * scaling rule without depending on the scaler above it; loss_scaler.h includes this header, so a
 * program includes loss_scaler.h alone. The rule itself is documented in loss_scaler.h. */
#ifndef APEX_LOSS_SCALER_CONFIG_H
#define APEX_LOSS_SCALER_CONFIG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum apex_scale_mode {
  APEX_SCALE_DYNAMIC = 0, /* the default */
  APEX_SCALE_STATIC = 1
} apex_scale_mode;

/* Zero in any field means its default. */
typedef struct apex_loss_scaler_config {
  apex_scale_mode mode;
  float init_scale;      /* dynamic: 2^16; static: 1.0 (the fixed scale) */
  float growth_factor;   /* 2.0; must be > 1 */
  float backoff_factor;  /* 0.5; must be in (0, 1) */
  int growth_interval;   /* 2000 steps without overflow before growing (Apex's scale_window); >= 1 */
  float min_scale;       /* 2^-24; must be > 0 */
  float max_scale;       /* 2^24 */
  int hysteresis;        /* 1: overflows tolerated before a backoff; >= 1 */
} apex_loss_scaler_config;

/* The saved state. Restoring it gives bitwise the same future as the scaler it was read from. */
typedef struct apex_loss_scaler_state {
  float scale;
  int32_t growth_tracker;     /* steps since the last overflow or growth */
  int32_t hysteresis_tracker; /* overflows left before the next backoff */
  int64_t steps;              /* updates so far */
  int64_t skipped;            /* updates that said skip */
} apex_loss_scaler_state;

/* Bytes of the serialised state (little-endian, versioned). */
#define APEX_LOSS_SCALER_STATE_BYTES 40

#ifdef __cplusplus
}
#endif
#endif
