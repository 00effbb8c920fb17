/* syncbn_stats.c: the numerics of SyncBatchNorm across ranks (the module wrapper lives with autograd).
 *
 * Forward: each rank reduces its own batch to (count, mean, M2) per channel in f64, the triples are
 * all-gathered and every rank merges them in rank order with Chan, Golub and LeVeque's pairwise
 * update. The same inputs in the same order give every rank the same bits, and ranks may hold
 * batches of different sizes (unlike averaging per-rank means). Backward: the per-channel sums of dy
 * and dy * xhat are summed over ranks with one all-reduce.
 *
 * Loops run over channels (or rows) on the library's threads; each channel is reduced by one thread
 * in a fixed order, so results do not depend on the thread count. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/threads.h"
#include "core/internal.h"
#include "parallel/pg_internal.h"

enum { TILE = 2048 };

/* x viewed as (N, C, S). */
typedef struct layout {
  size_t n, c, s;
} layout;

static layout layout_of(const apex_tensor *x) {
  layout l = {(size_t)apex_tensor_dim(x, 0), (size_t)apex_tensor_dim(x, 1), 1};
  for (int d = 2; d < apex_tensor_ndim(x); d++) l.s *= (size_t)apex_tensor_dim(x, d);
  return l;
}

static void load(float *dst, const apex_tensor *t, size_t at, size_t len) {
  apex_dtype dt = apex_tensor_dtype(t);
  apex__convert_range(dst, APEX_F32, (const char *)apex_tensor_data(t) + at * apex_dtype_size(dt), dt, len);
}

/* Checks a per-channel f32 statistics tensor. */
static apex_status check_channel(const apex_tensor *t, size_t c, const char *fn, const char *what) {
  if (!t) return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);
  if (apex_tensor_dtype(t) != APEX_F32)
    return apex__fail(APEX_ERR_DTYPE, "%s: %s is %s; per-channel statistics are f32", fn, what, apex_dtype_name(apex_tensor_dtype(t)));
  if (apex_tensor_numel(t) != c)
    return apex__fail(APEX_ERR_SHAPE, "%s: %s has %zu elements but x has %zu channels", fn, what, apex_tensor_numel(t), c);
  return APEX_OK;
}

static apex_status check_input(const apex_tensor *x, const char *fn, const char *what) {
  if (!x) return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);
  if (apex_tensor_ndim(x) < 2)
    return apex__fail(APEX_ERR_INVALID_ARG, "%s: %s has %d dimensions; batch norm needs (N, C, ...)", fn, what, apex_tensor_ndim(x));
  if (apex_tensor_device(x) != APEX_DEVICE_CPU) return apex__fail(APEX_ERR_DEVICE, "%s: %s is not on the CPU", fn, what);
  return APEX_OK;
}

/* ---- tensors on a device (a model on a GPU) ------------------------------------------------------------
 * The statistics are computed on the host from copies: the activations come down, the per-channel
 * results go back up. The same bits as on the CPU, and the same exchanges (over the group's host
 * side), at the cost of the copies; the per-channel work itself is small. */

static int on_device(const apex_tensor *t) { return t && apex_tensor_device(t) != APEX_DEVICE_CPU; }

/* A host copy of t (NULL for NULL): n copies in h[], released by unstage. */
typedef struct staged {
  apex_tensor *h[9];
  int n;
  apex_status st;
} staged;

static apex_tensor *stage(staged *s, const apex_tensor *t) {
  if (!t || s->st != APEX_OK) return NULL;
  apex_tensor *h = apex_tensor_create(apex_tensor_dtype(t), apex_tensor_ndim(t), apex_tensor_shape(t));
  if (!h) s->st = APEX_ERR_OUT_OF_MEMORY;
  else if ((s->st = apex_tensor_copy(h, t)) != APEX_OK) {
    apex_tensor_destroy(h);
    h = NULL;
  }
  if (h) s->h[s->n++] = h;
  return h;
}

/* Copies a host result back to its device tensor (nothing for NULL). */
static void unstage_out(staged *s, apex_tensor *dev, const apex_tensor *host, apex_status st) {
  if (st == APEX_OK && s->st == APEX_OK && dev && host) s->st = apex_tensor_copy(dev, host);
}

static void unstage(staged *s) {
  for (int i = 0; i < s->n; i++) apex_tensor_destroy(s->h[i]);
  s->n = 0;
}

/* mean and M2 of channel c, two passes in f64. */
static void channel_moments(const apex_tensor *x, layout l, size_t c, double *mean, double *m2) {
  float buf[TILE];
  double sum = 0.0, sq = 0.0;
  for (size_t i = 0; i < l.n; i++)
    for (size_t s0 = 0; s0 < l.s; s0 += TILE) {
      size_t len = l.s - s0 < TILE ? l.s - s0 : TILE;
      load(buf, x, (i * l.c + c) * l.s + s0, len);
      for (size_t k = 0; k < len; k++) sum += buf[k];
    }
  double count = (double)(l.n * l.s), mu = count > 0 ? sum / count : 0.0;
  for (size_t i = 0; i < l.n; i++)
    for (size_t s0 = 0; s0 < l.s; s0 += TILE) {
      size_t len = l.s - s0 < TILE ? l.s - s0 : TILE;
      load(buf, x, (i * l.c + c) * l.s + s0, len);
      for (size_t k = 0; k < len; k++) sq += ((double)buf[k] - mu) * ((double)buf[k] - mu);
    }
  *mean = mu;
  *m2 = sq;
}

typedef struct header {
  int64_t valid, channels, count, pad;
} header;

apex_status apex_syncbn_stats(apex_pg *pg, const apex_tensor *x, apex_tensor *mean_out, apex_tensor *invstd_out,
                              apex_tensor *unbiased_var_out, float eps, int64_t *total_count) {
  const char *fn = "apex_syncbn_stats";
  if (!pg) return apex__fail(APEX_ERR_INVALID_ARG, "%s: pg is NULL", fn);
  if (on_device(x) || on_device(mean_out) || on_device(invstd_out) || on_device(unbiased_var_out)) {
    staged s = {.st = APEX_OK};
    apex_tensor *hx = stage(&s, x), *hm = stage(&s, mean_out), *hi = stage(&s, invstd_out), *hu = stage(&s, unbiased_var_out);
    /* A failed copy still joins the exchange (as a NULL x), so that no rank waits for this one. */
    apex_status st = apex_syncbn_stats(pg, s.st == APEX_OK ? hx : NULL, hm ? hm : mean_out, hi ? hi : invstd_out, hu, eps, total_count);
    unstage_out(&s, mean_out, hm, st);
    unstage_out(&s, invstd_out, hi, st);
    unstage_out(&s, unbiased_var_out, hu, st);
    unstage(&s);
    return st != APEX_OK ? st : s.st;
  }
  /* Argument errors are shared with the other ranks (in the header) so that none waits for this one. */
  apex_status local = check_input(x, fn, "x");
  layout l = {0, 0, 0};
  if (local == APEX_OK) {
    l = layout_of(x);
    if (!(eps >= 0.0f) || !isfinite(eps)) local = apex__fail(APEX_ERR_INVALID_ARG, "%s: eps must be finite and >= 0 (got %g)", fn, (double)eps);
  }
  if (local == APEX_OK) local = check_channel(mean_out, l.c, fn, "mean_out");
  if (local == APEX_OK) local = check_channel(invstd_out, l.c, fn, "invstd_out");
  if (local == APEX_OK && unbiased_var_out) local = check_channel(unbiased_var_out, l.c, fn, "unbiased_var_out");
  char local_msg[APEX_PG_MESSAGE] = "";
  if (local != APEX_OK) snprintf(local_msg, sizeof local_msg, "%s", apex_last_error());

  int world = pg->world;
  header mine = {local == APEX_OK, (int64_t)l.c, (int64_t)(l.n * l.s), 0};
  header *hs = malloc((size_t)world * sizeof *hs);
  if (!hs) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  apex_status st = apex__pg_allgather_bytes(pg, &mine, hs, sizeof mine);
  int64_t total = 0;
  for (int r = 0; st == APEX_OK && r < world; r++) {
    if (local != APEX_OK) st = apex__fail(local, "%s", local_msg);
    else if (!hs[r].valid)
      st = apex__fail(APEX_ERR_INVALID_ARG, "%s: rank %d passed invalid arguments (its own error names them)", fn, r);
    else if (hs[r].channels != hs[0].channels)
      st = apex__fail(APEX_ERR_SHAPE, "%s: x has %lld channels on rank 0 but %lld on rank %d", fn, (long long)hs[0].channels,
                      (long long)hs[r].channels, r);
    total += hs[r].count;
  }
  if (st == APEX_OK && total < 2)
    st = apex__fail(APEX_ERR_INVALID_ARG, "%s: %lld value(s) per channel over all ranks; batch norm needs more than 1", fn, (long long)total);
  if (st != APEX_OK) {
    free(hs);
    return st;
  }

  /* This rank's moments, then everyone's. */
  size_t c = l.c, rec = 2 * c;
  double *all = malloc(((size_t)world + 1) * rec * sizeof *all + 1);
  if (!all) {
    free(hs);
    return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  }
  double *own = all + (size_t)world * rec;
  int threads = apex_get_num_threads();
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t k = 0; k < c; k++) channel_moments(x, l, k, &own[k], &own[c + k]);
  if (c > 0) st = apex__pg_allgather_bytes(pg, own, all, rec * sizeof *all);

  float *mean = st == APEX_OK ? apex_tensor_data(mean_out) : NULL;
  float *invstd = st == APEX_OK ? apex_tensor_data(invstd_out) : NULL;
  float *uvar = st == APEX_OK && unbiased_var_out ? apex_tensor_data(unbiased_var_out) : NULL;
  for (size_t k = 0; st == APEX_OK && k < c; k++) {
    double na = 0.0, ma = 0.0, m2a = 0.0;
    for (int r = 0; r < world; r++) {
      double nb = (double)hs[r].count;
      if (nb == 0.0) continue;
      double mb = all[(size_t)r * rec + k], m2b = all[(size_t)r * rec + c + k];
      if (na == 0.0) {
        na = nb, ma = mb, m2a = m2b;
        continue;
      }
      double n = na + nb, delta = mb - ma;
      ma += delta * (nb / n);
      m2a += m2b + delta * delta * (na * nb / n);
      na = n;
    }
    mean[k] = (float)ma;
    invstd[k] = (float)(1.0 / sqrt(m2a / na + (double)eps));
    if (uvar) uvar[k] = (float)(m2a / (na - 1.0));
  }
  if (st == APEX_OK && total_count) *total_count = total;
  free(all);
  free(hs);
  return st;
}

apex_status apex_syncbn_backward_reduce(apex_pg *pg, const apex_tensor *x, const apex_tensor *dy, const apex_tensor *mean,
                                        const apex_tensor *invstd, apex_tensor *sum_dy_out, apex_tensor *sum_dy_xhat_out) {
  const char *fn = "apex_syncbn_backward_reduce";
  if (!pg) return apex__fail(APEX_ERR_INVALID_ARG, "%s: pg is NULL", fn);
  if (on_device(x) || on_device(dy) || on_device(mean) || on_device(invstd) || on_device(sum_dy_out) || on_device(sum_dy_xhat_out)) {
    staged s = {.st = APEX_OK};
    apex_tensor *hx = stage(&s, x), *hd = stage(&s, dy), *hm = stage(&s, mean), *hi = stage(&s, invstd);
    apex_tensor *ho = stage(&s, sum_dy_out), *hh = stage(&s, sum_dy_xhat_out);
    if (s.st != APEX_OK) {
      unstage(&s);
      return apex__fail(s.st, "%s: cannot copy the tensors to the host: %s", fn, apex_last_error());
    }
    apex_status st = apex_syncbn_backward_reduce(pg, hx, hd, hm, hi, ho, hh);
    unstage_out(&s, sum_dy_out, ho, st);
    unstage_out(&s, sum_dy_xhat_out, hh, st);
    unstage(&s);
    return st != APEX_OK ? st : s.st;
  }
  apex_status st = check_input(x, fn, "x");
  if (st == APEX_OK) st = check_input(dy, fn, "dy");
  if (st != APEX_OK) return st;
  if (!apex_tensor_same_shape(x, dy)) {
    char a[96], b[96];
    return apex__fail(APEX_ERR_SHAPE, "%s: x is %s but dy is %s", fn, apex_tensor_shape_str(x, a, sizeof a), apex_tensor_shape_str(dy, b, sizeof b));
  }
  layout l = layout_of(x);
  if ((st = check_channel(mean, l.c, fn, "mean")) != APEX_OK || (st = check_channel(invstd, l.c, fn, "invstd")) != APEX_OK ||
      (st = check_channel(sum_dy_out, l.c, fn, "sum_dy_out")) != APEX_OK || (st = check_channel(sum_dy_xhat_out, l.c, fn, "sum_dy_xhat_out")) != APEX_OK)
    return st;
  size_t c = l.c;
  float *sums = malloc(2 * c * sizeof *sums + 1);
  if (!sums) return apex__fail(APEX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
  const float *mu = apex_tensor_data(mean), *is = apex_tensor_data(invstd);
  int threads = apex_get_num_threads();
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t k = 0; k < c; k++) {
    float xb[TILE], gb[TILE];
    double sdy = 0.0, sdx = 0.0;
    for (size_t i = 0; i < l.n; i++)
      for (size_t s0 = 0; s0 < l.s; s0 += TILE) {
        size_t len = l.s - s0 < TILE ? l.s - s0 : TILE, at = (i * c + k) * l.s + s0;
        load(xb, x, at, len);
        load(gb, dy, at, len);
        for (size_t j = 0; j < len; j++) {
          sdy += gb[j];
          sdx += (double)gb[j] * ((double)xb[j] - mu[k]);
        }
      }
    sums[k] = (float)sdy;
    sums[c + k] = (float)(sdx * is[k]);
  }
  st = c > 0 ? apex__pg_allreduce_f32(pg, sums, 2 * c, APEX_REDUCE_SUM) : APEX_OK;
  if (st == APEX_OK) {
    memcpy(apex_tensor_data(sum_dy_out), sums, c * sizeof *sums);
    memcpy(apex_tensor_data(sum_dy_xhat_out), sums + c, c * sizeof *sums);
  }
  free(sums);
  return st;
}

apex_status apex_syncbn_backward_input(const apex_tensor *x, const apex_tensor *dy, const apex_tensor *mean, const apex_tensor *invstd,
                                       const apex_tensor *weight, const apex_tensor *sum_dy, const apex_tensor *sum_dy_xhat,
                                       int64_t total_count, apex_tensor *dx) {
  const char *fn = "apex_syncbn_backward_input";
  if (on_device(x) || on_device(dy) || on_device(mean) || on_device(invstd) || on_device(weight) || on_device(sum_dy) ||
      on_device(sum_dy_xhat) || on_device(dx)) {
    staged s = {.st = APEX_OK};
    apex_tensor *hx = stage(&s, x), *hd = stage(&s, dy), *hm = stage(&s, mean), *hi = stage(&s, invstd), *hw = stage(&s, weight);
    apex_tensor *hs = stage(&s, sum_dy), *hh = stage(&s, sum_dy_xhat), *ho = stage(&s, dx);
    if (s.st != APEX_OK) {
      unstage(&s);
      return apex__fail(s.st, "%s: cannot copy the tensors to the host: %s", fn, apex_last_error());
    }
    apex_status st = apex_syncbn_backward_input(hx, hd, hm, hi, hw, hs, hh, total_count, ho);
    unstage_out(&s, dx, ho, st);
    unstage(&s);
    return st != APEX_OK ? st : s.st;
  }
  apex_status st = check_input(x, fn, "x");
  if (st == APEX_OK) st = check_input(dy, fn, "dy");
  if (st == APEX_OK) st = check_input(dx, fn, "dx");
  if (st != APEX_OK) return st;
  if (!apex_tensor_same_shape(x, dy) || !apex_tensor_same_shape(x, dx)) {
    char a[96], b[96], d[96];
    return apex__fail(APEX_ERR_SHAPE, "%s: x is %s, dy is %s and dx is %s; they need one shape", fn, apex_tensor_shape_str(x, a, sizeof a),
                      apex_tensor_shape_str(dy, b, sizeof b), apex_tensor_shape_str(dx, d, sizeof d));
  }
  if (total_count < 1) return apex__fail(APEX_ERR_INVALID_ARG, "%s: total_count is %lld; it must be >= 1", fn, (long long)total_count);
  layout l = layout_of(x);
  if ((st = check_channel(mean, l.c, fn, "mean")) != APEX_OK || (st = check_channel(invstd, l.c, fn, "invstd")) != APEX_OK ||
      (st = check_channel(sum_dy, l.c, fn, "sum_dy")) != APEX_OK || (st = check_channel(sum_dy_xhat, l.c, fn, "sum_dy_xhat")) != APEX_OK ||
      (weight && (st = check_channel(weight, l.c, fn, "weight")) != APEX_OK))
    return st;
  const float *mu = apex_tensor_data(mean), *is = apex_tensor_data(invstd), *sd = apex_tensor_data(sum_dy),
              *sx = apex_tensor_data(sum_dy_xhat), *w = weight ? apex_tensor_data(weight) : NULL;
  float inv_n = 1.0f / (float)total_count;
  apex_dtype ddt = apex_tensor_dtype(dx);
  char *out = apex_tensor_data(dx);
  size_t rows = l.n * l.c, esz = apex_dtype_size(ddt);
  int threads = apex_get_num_threads();
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t row = 0; row < rows; row++) {
    size_t k = row % l.c;
    float xb[TILE], gb[TILE];
    float scale = (w ? w[k] : 1.0f) * is[k], mdy = sd[k] * inv_n, mdx = sx[k] * inv_n;
    for (size_t s0 = 0; s0 < l.s; s0 += TILE) {
      size_t len = l.s - s0 < TILE ? l.s - s0 : TILE, at = row * l.s + s0;
      load(xb, x, at, len);
      load(gb, dy, at, len);
      for (size_t j = 0; j < len; j++) xb[j] = scale * (gb[j] - mdy - (xb[j] - mu[k]) * is[k] * mdx);
      apex__convert_range(out + at * esz, ddt, xb, APEX_F32, len);
    }
  }
  return APEX_OK;
}
