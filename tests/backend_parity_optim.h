/* backend_parity_optim.h: parity cases of conversions, the multi-tensor kernels, the loss scaler and the
 * fused optimizers on the device under test against the CPU (bounds: backend_parity_cases.h). */
#ifndef APEX_TESTS_BACKEND_PARITY_OPTIM_H
#define APEX_TESTS_BACKEND_PARITY_OPTIM_H

#include "backend_parity_util.h"

/* ---- conversions ------------------------------------------------------------------------------------ */

static void pc_convert_bitwise(void) {
  /* Every 16-bit pattern up, and random f32 with specials down, on both devices. */
  int64_t n = 65536;
  for (int dt = APEX_F16; dt <= APEX_BF16; dt++) {
    apex_tensor *h16 = apex_tensor_create((apex_dtype)dt, 1, &n);
    for (int64_t i = 0; i < n; i++) ((uint16_t *)apex_tensor_data(h16))[i] = (uint16_t)i;
    apex_tensor *d16 = dev_copy(h16);
    apex_tensor *d32 = apex_tensor_to(d16, APEX_F32), *h32 = apex_tensor_to(h16, APEX_F32);
    assert_same_bits(d32, h32, "16-bit -> f32");
    apex_tensor_destroy(d32);
    apex_tensor_destroy(h32);
    apex_tensor_destroy(d16);
    apex_tensor_destroy(h16);
  }
  int64_t m = 1 << 20;
  apex_tensor *h = apex_tensor_create(APEX_F32, 1, &m);
  uint64_t x = 88172645463325252ull;
  for (int64_t i = 0; i < m; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ((uint32_t *)apex_tensor_data(h))[i] = (uint32_t)x; /* every kind of f32: NaNs, Infs, subnormals */
  }
  apex_tensor *d = dev_copy(h);
  for (int dt = APEX_F16; dt <= APEX_BF16; dt++) {
    apex_tensor *dd = apex_tensor_to(d, (apex_dtype)dt), *hh = apex_tensor_to(h, (apex_dtype)dt);
    assert_same_bits(dd, hh, "f32 -> 16-bit");
    /* the host-side staging paths of apex_tensor_copy: CPU f32 into a GPU f16, GPU f32 into a CPU f16 */
    apex_tensor *mixed = apex_tensor_create_on(pc_dev, (apex_dtype)dt, 1, &m);
    TU_OK(apex_tensor_copy(mixed, h));
    assert_same_bits(mixed, hh, "CPU f32 -> GPU 16-bit");
    apex_tensor *down = apex_tensor_create((apex_dtype)dt, 1, &m);
    TU_OK(apex_tensor_copy(down, d));
    assert_memory_equal(apex_tensor_data(down), apex_tensor_data(hh), apex_tensor_nbytes(hh));
    apex_tensor_destroy(down);
    apex_tensor_destroy(mixed);
    apex_tensor_destroy(dd);
    apex_tensor_destroy(hh);
  }
  apex_tensor_destroy(d);
  apex_tensor_destroy(h);
}

/* ---- multi-tensor kernels and the device loss scaler ------------------------------------------------------ */

static void pc_multi_tensor_parity(void) {
  enum { N = 5 };
  const size_t sizes[N] = {1, 16383, 16384, 16385, 300001}; /* around the GPU chunk */
  apex_tensor *h[N], *d[N], *ho[N], *dout[N];
  for (int i = 0; i < N; i++) {
    h[i] = tu_random_tensor(i % 2 ? APEX_F16 : APEX_F32, sizes[i], 11 + i, 100.0f);
    d[i] = dev_copy(h[i]);
    ho[i] = apex_tensor_create(APEX_F32, 1, (int64_t[]){(int64_t)sizes[i]});
    dout[i] = apex_tensor_create_on(pc_dev, APEX_F32, 1, (int64_t[]){(int64_t)sizes[i]});
  }
  int ovh = 0, ovd = 0;
  TU_OK(apex_mt_scale(0, &ovh, h, ho, N, 1.0f / 1024));
  TU_OK(apex_mt_scale(0, &ovd, d, dout, N, 1.0f / 1024));
  assert_int_equal(ovh, 0);
  assert_int_equal(ovd, 0);
  for (int i = 0; i < N; i++) assert_same_bits(dout[i], ho[i], "mt_scale"); /* one multiply: exact */
  TU_OK(apex_mt_axpby(0, &ovh, h, ho, ho, N, 0.5f, -2.0f, -1));
  TU_OK(apex_mt_axpby(0, &ovd, d, dout, dout, N, 0.5f, -2.0f, -1));
  for (int i = 0; i < N; i++) assert_same_bits(dout[i], ho[i], "mt_axpby");
  float gh, gd, ph[N], pd[N];
  TU_OK(apex_mt_unscale_l2norm(0, &ovh, h, N, 0.25f, &gh, ph));
  TU_OK(apex_mt_unscale_l2norm(0, &ovd, d, N, 0.25f, &gd, pd));
  assert_true(fabs(gd - gh) <= 1e-5 * gh); /* summation orders differ: f32 partials, f64 across */
  for (int i = 0; i < N; i++) assert_true(fabs(pd[i] - ph[i]) <= 1e-5 * ph[i]);
  /* An Inf in the last element of the big tensor raises the flag. */
  apex_tensor_set(d[N - 1], sizes[N - 1] - 1, INFINITY);
  ovd = 0;
  TU_OK(apex_mt_scale(0, &ovd, d, dout, N, 1.0f));
  assert_int_equal(ovd, 1);
  /* CPU and GPU tensors in one list: refused, naming the tensor. */
  apex_tensor *mixed[2] = {d[0], h[1]}, *mo[2] = {dout[0], dout[1]};
  TU_FAILS(apex_mt_scale(0, &ovd, mixed, mo, 2, 1.0f), APEX_ERR_DEVICE, "list 0 tensor 1");
  /* apex_mt_check_finite on device lists: the CPU's answers (the Inf above, then NaN in an f32 and
   * in an f16 tensor), the int overwritten each time, a mixed list refused with the int untouched. */
  int fd = 0, fh = 1;
  TU_OK(apex_mt_check_finite(d, N, &fd));
  assert_int_equal(fd, 1);
  TU_OK(apex_mt_check_finite(h, N, &fh));
  assert_int_equal(fh, 0);
  apex_tensor_set(d[N - 1], sizes[N - 1] - 1, 1.0f);
  TU_OK(apex_mt_check_finite(d, N, &fd));
  assert_int_equal(fd, 0);
  for (int k = 0; k < 2; k++) { /* d[2] is f32, d[3] is f16 */
    apex_tensor_set(d[2 + k], 16383, NAN);
    TU_OK(apex_mt_check_finite(d, N, &fd));
    assert_int_equal(fd, 1);
    apex_tensor_set(d[2 + k], 16383, 0.5f);
  }
  fd = 7;
  TU_FAILS(apex_mt_check_finite(mixed, 2, &fd), APEX_ERR_DEVICE, "tensor 1");
  assert_int_equal(fd, 7);
  for (int i = 0; i < N; i++) {
    apex_tensor_destroy(h[i]);
    apex_tensor_destroy(d[i]);
    apex_tensor_destroy(ho[i]);
    apex_tensor_destroy(dout[i]);
  }
}

static void pc_device_scaler_matches_cpu(void) {
  apex_loss_scaler_config cfg = {.init_scale = 1024.0f, .growth_interval = 3, .hysteresis = 2, .min_scale = 1.0f};
  apex_loss_scaler *cpu = apex_loss_scaler_create(&cfg);
  apex_loss_scaler *gpu = apex_loss_scaler_create_on(pc_dev, &cfg);
  assert_non_null(gpu);
  int64_t n = 100;
  apex_tensor *g = apex_tensor_create_on(pc_dev, APEX_F16, 1, &n);
  apex_tensor *gl[1] = {g};
  uint32_t x = 12345;
  for (int step = 0; step < 200; step++) {
    x = x * 1103515245u + 12345u;
    int inf = (x >> 16) % 4 == 0;
    TU_OK(apex_tensor_fill(g, inf ? INFINITY : 1.0f));
    TU_OK(apex_loss_scaler_check(gpu, gl, 1));
    apex_loss_scaler_update(cpu, inf, NULL);
    TU_OK(apex_loss_scaler_update(gpu, 0, NULL));
  }
  apex_loss_scaler_state a = apex_loss_scaler_get_state(cpu), b;
  b = apex_loss_scaler_get_state(gpu);
  tu_assert_scaler_state_equal(&b, &a);
  assert_int_equal(apex_loss_scaler_device(gpu), pc_dev);
  assert_true(apex_loss_scaler_scale(gpu) == a.scale); /* read back from the device */
  /* a found_inf from the host joins the device flag; a skip answer would wait, so it is refused */
  TU_OK(apex_loss_scaler_update(gpu, 1, NULL));
  apex_loss_scaler_update(cpu, 1, NULL);
  a = apex_loss_scaler_get_state(cpu);
  b = apex_loss_scaler_get_state(gpu);
  tu_assert_scaler_state_equal(&b, &a);
  int skip = 0;
  TU_FAILS(apex_loss_scaler_update(gpu, 0, &skip), APEX_ERR_INVALID_ARG, "pass skip = NULL");
  b = apex_loss_scaler_get_state(gpu);
  tu_assert_scaler_state_equal(&b, &a);
  /* unscale divides by the scale; set_state validates as the CPU scaler does */
  TU_OK(apex_tensor_fill(g, 3.0f));
  TU_OK(apex_loss_scaler_unscale(gpu, gl, gl, 1));
  assert_true(apex_tensor_get(g, 5) == apex_f16_to_f32(apex_f32_to_f16(3.0f / a.scale)));
  apex_loss_scaler_state bad = a;
  bad.scale = -1.0f;
  TU_FAILS(apex_loss_scaler_set_state(gpu, &bad), APEX_ERR_INVALID_ARG, "scale");
  apex_tensor *hg = apex_tensor_create(APEX_F16, 1, &n), *hl[1] = {hg};
  TU_FAILS(apex_loss_scaler_check(gpu, hl, 1), APEX_ERR_DEVICE, "tensor 0 is on the CPU");
  apex_tensor_destroy(hg);
  apex_tensor_destroy(g);
  apex_loss_scaler_destroy(gpu);
  apex_loss_scaler_destroy(cpu);
}

/* ---- the fused optimizers ------------------------------------------------------------------------------ */

/* Destroys the host and device parameters and gradients of an optimizer case. */
static void destroy_params(int n, apex_tensor **hp, apex_tensor **dp, apex_tensor **hg, apex_tensor **dg) {
  for (int i = 0; i < n; i++) {
    apex_tensor_destroy(hp[i]);
    apex_tensor_destroy(dp[i]);
    apex_tensor_destroy(hg[i]);
    apex_tensor_destroy(dg[i]);
  }
}

typedef struct {
  apex_optim_kind kind;
  apex_optim_options o;
  uint32_t ulps; /* allowed difference in f32 ulps (0: bitwise) */
} optim_case;

static void run_optim_case(const optim_case *c, apex_dtype pdt) {
  enum { P = 3 };
  const size_t sizes[P] = {17, 20000, 70001};
  apex_tensor *hp[P], *dp[P], *hg[P], *dg[P];
  for (int i = 0; i < P; i++) {
    apex_tensor *f = tu_random_tensor(APEX_F32, sizes[i], 100 + i, 1.0f);
    hp[i] = apex_tensor_to(f, pdt);
    dp[i] = dev_copy(hp[i]);
    hg[i] = apex_tensor_create(APEX_F16, 1, (int64_t[]){(int64_t)sizes[i]});
    dg[i] = apex_tensor_create_on(pc_dev, APEX_F16, 1, (int64_t[]){(int64_t)sizes[i]});
    apex_tensor_destroy(f);
  }
  apex_optimizer *ho = apex_optimizer_create(c->kind, &c->o), *dopt = apex_optimizer_create(c->kind, &c->o);
  /* The middle parameter has no gradient in group 0's first steps: it must be skipped on both. */
  TU_OK(apex_optimizer_add_group(ho, hp, P, hg, P, NULL, NULL));
  TU_OK(apex_optimizer_add_group(dopt, dp, P, dg, P, NULL, NULL));
  TU_OK(apex_optimizer_set_grad(ho, 0, 1, NULL));
  TU_OK(apex_optimizer_set_grad(dopt, 0, 1, NULL));
  for (int step = 0; step < 10; step++) {
    if (step == 3) {
      TU_OK(apex_optimizer_set_grad(ho, 0, 1, hg[1]));
      TU_OK(apex_optimizer_set_grad(dopt, 0, 1, dg[1]));
    }
    for (int i = 0; i < P; i++) {
      apex_tensor *r = tu_random_tensor(APEX_F32, sizes[i], 1000 * step + i, 512.0f); /* scaled by 256 */
      TU_OK(apex_tensor_copy(hg[i], r));
      TU_OK(apex_tensor_copy(dg[i], hg[i]));
      apex_tensor_destroy(r);
    }
    TU_OK(apex_optimizer_step(ho, 256.0f, 0));
    TU_OK(apex_optimizer_step(dopt, 256.0f, 0));
  }
  for (int i = 0; i < P; i++) {
    assert_int_equal(apex_optimizer_step_count(dopt, 0, i), apex_optimizer_step_count(ho, 0, i));
    uint32_t u = max_ulps(apex_optimizer_master(dopt, 0, i), apex_optimizer_master(ho, 0, i));
    if (u > c->ulps)
      fail_msg("%s %s: parameter %d is %u ulps from the CPU (allowed %u)", apex_optim_kind_name(c->kind),
               apex_dtype_name(pdt), i, u, c->ulps);
    if (pdt != APEX_F32 && c->ulps == 0) assert_same_bits(dp[i], hp[i], "model copy");
  }
  apex_optimizer_destroy(ho);
  apex_optimizer_destroy(dopt);
  destroy_params(P, hp, dp, hg, dg);
}

static void pc_optimizers_match_cpu(void) {
  const optim_case cases[] = {
      {APEX_OPTIM_SGD, {.lr = 0.1f}, 0},
      {APEX_OPTIM_SGD, {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 1e-2f}, 0},
      {APEX_OPTIM_SGD, {.lr = 0.1f, .momentum = 0.9f, .nesterov = APEX_OPTIM_ON, .weight_decay = 1e-2f,
                        .wd_after_momentum = APEX_OPTIM_ON}, 0},
      {APEX_OPTIM_ADAM, {.lr = 1e-2f, .weight_decay = 1e-2f}, 2},
      {APEX_OPTIM_ADAMW, {.lr = 1e-2f, .weight_decay = 1e-1f}, 2},
      {APEX_OPTIM_ADAMW, {.lr = 1e-2f, .amsgrad = APEX_OPTIM_ON, .bias_correction = APEX_OPTIM_OFF}, 2},
      {APEX_OPTIM_ADADELTA, {.weight_decay = 1e-2f}, 0},
      {APEX_OPTIM_ADAGRAD, {.lr_decay = 1e-2f, .weight_decay = 1e-2f, .initial_accumulator_value = 0.1f}, 0},
      {APEX_OPTIM_ADAGRAD, {.adagrad_w_mode = APEX_OPTIM_ON, .weight_decay = 1e-2f}, 0},
      {APEX_OPTIM_RMSPROP, {.momentum = 0.9f, .centered = APEX_OPTIM_ON, .weight_decay = 1e-2f}, 0},
      {APEX_OPTIM_RMSPROP_TF, {.momentum = 0.9f, .centered = APEX_OPTIM_ON, .decoupled_decay = APEX_OPTIM_ON,
                               .weight_decay = 1e-2f}, 0},
      {APEX_OPTIM_RMSPROP_TF, {.lr_in_momentum = APEX_OPTIM_OFF, .momentum = 0.5f}, 0},
      /* LAMB's per-tensor norms are summed in another order on the GPU: the trust ratio, and so the
       * parameters, may differ from the CPU's in the last bits. */
      {APEX_OPTIM_LAMB, {.lr = 1e-2f, .weight_decay = 1e-2f}, 64}, /* global-norm clipping on (max_grad_norm 1) */
      {APEX_OPTIM_LAMB, {.lr = 1e-2f, .max_grad_norm = 0.0f, .use_nvlamb = APEX_OPTIM_ON}, 64},
      {APEX_OPTIM_LAMB, {.lr = 1e-2f, .weight_decay = 1e-2f, .adam_w_mode = APEX_OPTIM_OFF,
                         .grad_averaging = APEX_OPTIM_OFF, .bias_correction = APEX_OPTIM_OFF}, 64},
      /* NovoGrad: per-tensor L2 norms in another order; the moment blend in device double arithmetic. */
      {APEX_OPTIM_NOVOGRAD, {.lr = 1e-2f, .weight_decay = 1e-2f}, 64},
      {APEX_OPTIM_NOVOGRAD, {.lr = 1e-2f, .weight_decay = 1e-2f, .norm_type = APEX_OPTIM_NORM_INF,
                             .reg_inside_moment = APEX_OPTIM_ON, .init_zero = APEX_OPTIM_ON}, 64},
      {APEX_OPTIM_NOVOGRAD, {.lr = 1e-2f, .grad_averaging = APEX_OPTIM_OFF, .bias_correction = APEX_OPTIM_OFF}, 64},
  };
  const apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int d = 0; d < 3; d++) run_optim_case(&cases[k], dts[d]);
}

/* The update kernel moves elements in vectors of four, per list, where every pointer of a tensor is aligned
 * to four elements (the last count % 4 elements one by one), else one by one throughout; its
 * dtypes are compiled in for f32 parameters or masters with one gradient dtype and one model dtype, and read
 * per tensor otherwise. Sizes around multiples of 4, parameters and gradients that are views at an odd
 * element offset (so misaligned), and groups that mix parameter dtypes take each path; each must give the
 * CPU's result as the plain cases above do. */
typedef struct {
  size_t size;
  size_t offset; /* > 0: parameter and gradient are views starting at this element of a longer buffer */
  apex_dtype pdt;
} path_param;

/* A device tensor of h's values: a plain one, or (offset > 0) a view at element `offset` of *buf, a buffer
 * of 7s one element longer than offset + numel, so that writes outside the view show. */
static apex_tensor *dev_copy_at(const apex_tensor *h, size_t offset, apex_tensor **buf) {
  *buf = NULL;
  if (!offset) return dev_copy(h);
  int64_t whole = (int64_t)(apex_tensor_numel(h) + offset + 1), n = (int64_t)apex_tensor_numel(h);
  *buf = apex_tensor_create_on(pc_dev, apex_tensor_dtype(h), 1, &whole);
  assert_non_null(*buf);
  TU_OK(apex_tensor_fill(*buf, 7.0f));
  apex_tensor *v = apex_tensor_slice_view(*buf, offset, 1, &n);
  assert_non_null(v);
  TU_OK(apex_tensor_copy(v, h));
  return v;
}

/* Asserts the elements of buf outside [offset, offset + n) are still 7. */
static void assert_outside_untouched(const apex_tensor *buf, size_t offset, size_t n) {
  apex_tensor *h = host_copy(buf);
  for (size_t i = 0; i < apex_tensor_numel(h); i++)
    if ((i < offset || i >= offset + n) && apex_tensor_get(h, i) != 7.0f)
      fail_msg("element %zu outside a view of [%zu, %zu) was written", i, offset, offset + n);
  apex_tensor_destroy(h);
}

static void run_path_case(const optim_case *c, int n, const path_param *pp, int same_grad_dtype, int steps) {
  apex_tensor **hp = calloc((size_t)n, sizeof *hp), **dp = calloc((size_t)n, sizeof *dp);
  apex_tensor **hg = calloc((size_t)n, sizeof *hg), **dg = calloc((size_t)n, sizeof *dg);
  apex_tensor **pbuf = calloc((size_t)n, sizeof *pbuf), **gbuf = calloc((size_t)n, sizeof *gbuf);
  assert_true(hp && dp && hg && dg && pbuf && gbuf);
  for (int i = 0; i < n; i++) {
    apex_tensor *f = tu_random_tensor(APEX_F32, pp[i].size, 2000 + (uint64_t)i, 1.0f);
    apex_dtype gdt = same_grad_dtype ? pp[i].pdt : APEX_F16;
    hp[i] = apex_tensor_to(f, pp[i].pdt);
    dp[i] = dev_copy_at(hp[i], pp[i].offset, &pbuf[i]);
    hg[i] = apex_tensor_create(gdt, 1, (int64_t[]){(int64_t)pp[i].size});
    apex_tensor *zero = apex_tensor_create(gdt, 1, (int64_t[]){(int64_t)pp[i].size});
    TU_OK(apex_tensor_fill(zero, 0.0f));
    dg[i] = dev_copy_at(zero, pp[i].offset, &gbuf[i]);
    apex_tensor_destroy(zero);
    apex_tensor_destroy(f);
  }
  apex_optimizer *ho = apex_optimizer_create(c->kind, &c->o), *dopt = apex_optimizer_create(c->kind, &c->o);
  TU_OK(apex_optimizer_add_group(ho, hp, n, hg, n, NULL, NULL));
  TU_OK(apex_optimizer_add_group(dopt, dp, n, dg, n, NULL, NULL));
  for (int step = 0; step < steps; step++) {
    for (int i = 0; i < n; i++) {
      apex_tensor *r = tu_random_tensor(APEX_F32, pp[i].size, 3000 * (uint64_t)step + (uint64_t)i, 512.0f);
      TU_OK(apex_tensor_copy(hg[i], r));
      TU_OK(apex_tensor_copy(dg[i], hg[i]));
      apex_tensor_destroy(r);
    }
    TU_OK(apex_optimizer_step(ho, 256.0f, 0));
    TU_OK(apex_optimizer_step(dopt, 256.0f, 0));
  }
  for (int i = 0; i < n; i++) {
    assert_int_equal(apex_optimizer_step_count(dopt, 0, i), steps);
    uint32_t u = max_ulps(apex_optimizer_master(dopt, 0, i), apex_optimizer_master(ho, 0, i));
    if (u > c->ulps)
      fail_msg("%s: %s parameter %d of %zu at offset %zu (gradient %s) is %u ulps from the CPU (allowed %u)",
               apex_optim_kind_name(c->kind), apex_dtype_name(pp[i].pdt), i, pp[i].size, pp[i].offset,
               same_grad_dtype ? "same dtype" : "f16", u, c->ulps);
    if (pp[i].pdt != APEX_F32 && c->ulps == 0) assert_same_bits(dp[i], hp[i], "model copy");
    if (pp[i].offset) assert_outside_untouched(pbuf[i], pp[i].offset, pp[i].size);
  }
  apex_optimizer_destroy(ho);
  apex_optimizer_destroy(dopt);
  destroy_params(n, hp, dp, hg, dg);
  for (int i = 0; i < n; i++) apex_tensor_destroy(pbuf[i]), apex_tensor_destroy(gbuf[i]);
  free(hp), free(dp), free(hg), free(dg), free(pbuf), free(gbuf);
}

static void pc_optimizer_vector_and_scalar_paths(void) {
  const optim_case cases[] = {
      {APEX_OPTIM_ADAMW, {.lr = 1e-2f, .weight_decay = 1e-1f}, 2},
      {APEX_OPTIM_ADAM, {.lr = 1e-2f, .amsgrad = APEX_OPTIM_ON, .weight_decay = 1e-2f}, 2},
      {APEX_OPTIM_SGD, {.lr = 0.1f, .momentum = 0.9f, .nesterov = APEX_OPTIM_ON, .weight_decay = 1e-2f}, 0},
      {APEX_OPTIM_ADADELTA, {.weight_decay = 1e-2f}, 0},
      {APEX_OPTIM_ADAGRAD, {.lr_decay = 1e-2f, .weight_decay = 1e-2f}, 0},
      {APEX_OPTIM_RMSPROP, {.momentum = 0.9f, .centered = APEX_OPTIM_ON, .weight_decay = 1e-2f}, 0},
      {APEX_OPTIM_RMSPROP_TF, {.centered = APEX_OPTIM_ON, .weight_decay = 1e-2f}, 0},
      /* the kinds with per-tensor norms (64 ulps: pc_optimizers_match_cpu's bound), on the same walk */
      {APEX_OPTIM_LAMB, {.lr = 1e-2f, .weight_decay = 1e-2f}, 64},
      {APEX_OPTIM_NOVOGRAD, {.lr = 1e-2f, .weight_decay = 1e-2f}, 64},
      {APEX_OPTIM_ADAMP, {.lr = 1e-2f, .weight_decay = 1e-2f}, 64},
  };
  const apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  const size_t sizes[] = {1, 3, 4, 4096, 4099, 70001, 16384 * 2 + 5};
  enum { NS = sizeof sizes / sizeof sizes[0] };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    /* One dtype per group (the compiled instances), aligned and misaligned tensors side by side. */
    for (int d = 0; d < 3; d++) {
      path_param pp[NS + 2];
      for (int i = 0; i < NS; i++) pp[i] = (path_param){sizes[i], 0, dts[d]};
      pp[NS] = (path_param){4097, 1, dts[d]};
      pp[NS + 1] = (path_param){70001, 3, dts[d]};
      run_path_case(&cases[k], NS + 2, pp, 1, 4);
      run_path_case(&cases[k], NS + 2, pp, 0, 2); /* f16 gradients: another compiled instance */
    }
    /* Mixed parameter dtypes in one group: the run-time-dtype instance. */
    path_param mixed[NS + 1];
    for (int i = 0; i < NS; i++) mixed[i] = (path_param){sizes[i], 0, dts[i % 3]};
    mixed[NS] = (path_param){4099, 1, APEX_BF16};
    run_path_case(&cases[k], NS + 1, mixed, 1, 3);
  }
  /* More tensors than one launch's table (256: mt_ilp.cuh), and many more elements than the grid has blocks,
   * so that blocks' shares start and end inside tensors and cross many small ones: AdamW, whose figures the
   * benchmark reports. */
  enum { MANY = 300 };
  path_param many[MANY];
  for (int i = 0; i < MANY; i++) many[i] = (path_param){(size_t)(i * 977 % 5003) + 1, (size_t)(i % 5 == 4), APEX_BF16};
  many[10].size = 5000003;
  many[20].size = 4 * 1048576;
  many[30].size = 16384;
  run_path_case(&cases[0], MANY, many, 1, 3);
  for (int i = 0; i < MANY; i++) many[i].pdt = APEX_F32;
  run_path_case(&cases[0], MANY, many, 1, 2);
  /* LAMB, NovoGrad and AdamP over the same 300 tensors: past one table (256) and AdamP's 128 parameters a
   * launch pair */
  for (size_t k = sizeof cases / sizeof cases[0] - 3; k < sizeof cases / sizeof cases[0]; k++) run_path_case(&cases[k], MANY, many, 1, 2);
}

/* AdamP's projection depends on each tensor's shape: parameters of 3, 2 and 1 dimensions, with gradients
 * that make the projection happen per row (each row of g orthogonal to that row of p), for the whole
 * tensor (g orthogonal to p as a whole, its rows not), or not at all (random g), over 10 steps. The GPU
 * sums rows in another order than the CPU: 64 ulps allowed, as for LAMB. */
enum { ADAMP_RANDOM, ADAMP_PER_ROW, ADAMP_WHOLE };

/* g = random * 256 (the loss scale), made orthogonal to the CPU's current p as `how` says. */
static void adamp_grad(apex_tensor *hg, const apex_tensor *p, int how, uint64_t seed) {
  size_t n = apex_tensor_numel(hg), rows = how == ADAMP_PER_ROW ? (size_t)apex_tensor_dim(p, 0) : 1, len = n / rows;
  apex_tensor *r = tu_random_tensor(APEX_F32, n, seed, 1.0f);
  for (size_t row = 0; row < rows; row++) {
    double rp = 0, pp = 0;
    for (size_t i = row * len; i < (row + 1) * len; i++) {
      rp += (double)apex_tensor_get(r, i) * apex_tensor_get(p, i);
      pp += (double)apex_tensor_get(p, i) * apex_tensor_get(p, i);
    }
    double c = how == ADAMP_RANDOM || pp == 0 ? 0 : rp / pp;
    for (size_t i = row * len; i < (row + 1) * len; i++)
      apex_tensor_set(hg, i, (float)(256.0 * (apex_tensor_get(r, i) - c * apex_tensor_get(p, i))));
  }
  apex_tensor_destroy(r);
}

static void adamp_case(const apex_optim_options *o, apex_dtype pdt) {
  enum { P = 4 };
  const int64_t shapes[P][3] = {{6, 5, 7}, {64, 300, 0}, {40, 250, 0}, {40001, 0, 0}};
  const int ndims[P] = {3, 2, 2, 1}, how[P] = {ADAMP_PER_ROW, ADAMP_PER_ROW, ADAMP_WHOLE, ADAMP_RANDOM};
  apex_tensor *hp[P], *dp[P], *hg[P], *dg[P];
  for (int i = 0; i < P; i++) {
    hp[i] = apex_tensor_create(pdt, ndims[i], shapes[i]);
    apex_tensor *f = tu_random_tensor(APEX_F32, apex_tensor_numel(hp[i]), 400 + i, 1.0f);
    for (size_t j = 0; j < apex_tensor_numel(f); j++) apex_tensor_set(hp[i], j, apex_tensor_get(f, j));
    dp[i] = dev_copy(hp[i]);
    hg[i] = apex_tensor_create(APEX_F32, ndims[i], shapes[i]);
    dg[i] = apex_tensor_create_on(pc_dev, APEX_F32, ndims[i], shapes[i]);
    apex_tensor_destroy(f);
  }
  apex_optimizer *ho = apex_optimizer_create(APEX_OPTIM_ADAMP, o), *dopt = apex_optimizer_create(APEX_OPTIM_ADAMP, o);
  TU_OK(apex_optimizer_add_group(ho, hp, P, hg, P, NULL, NULL));
  TU_OK(apex_optimizer_add_group(dopt, dp, P, dg, P, NULL, NULL));
  for (int step = 0; step < 10; step++) {
    for (int i = 0; i < P; i++) {
      const apex_tensor *cur = apex_optimizer_master(ho, 0, i) ? apex_optimizer_master(ho, 0, i) : hp[i];
      adamp_grad(hg[i], cur, how[i], 2000 + 10 * (uint64_t)step + (uint64_t)i);
      TU_OK(apex_tensor_copy(dg[i], hg[i]));
    }
    TU_OK(apex_optimizer_step(ho, 256.0f, 0));
    TU_OK(apex_optimizer_step(dopt, 256.0f, 0));
  }
  for (int i = 0; i < P; i++) {
    assert_int_equal(apex_optimizer_step_count(dopt, 0, i), 10);
    const apex_tensor *dm = apex_optimizer_master(dopt, 0, i) ? apex_optimizer_master(dopt, 0, i) : dp[i];
    const apex_tensor *hm = apex_optimizer_master(ho, 0, i) ? apex_optimizer_master(ho, 0, i) : hp[i];
    uint32_t u = max_ulps(dm, hm);
    if (u > 64) fail_msg("AdamP %s: parameter %d is %u ulps from the CPU (allowed 64)", apex_dtype_name(pdt), i, u);
  }
  apex_optimizer_destroy(ho);
  apex_optimizer_destroy(dopt);
  destroy_params(P, hp, dp, hg, dg);
}

static void pc_adamp_matches_cpu(void) {
  const apex_optim_options opts[] = {
      {.lr = 1e-2f, .weight_decay = 1e-2f},
      {.lr = 1e-2f, .weight_decay = 1e-1f, .nesterov = APEX_OPTIM_ON, .delta = 0.2f, .wd_ratio = 0.5f},
  };
  const apex_dtype dts[3] = {APEX_F32, APEX_F16, APEX_BF16};
  for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
    for (int d = 0; d < 3; d++) adamp_case(&opts[k], dts[d]);
}

/* ---- GPU optimizer state: save, load, resume ---- */

static void *save_state(const apex_optimizer *o, size_t *size) {
  TU_OK(apex_optimizer_state_size(o, size));
  void *buf = malloc(*size);
  TU_OK(apex_optimizer_save(o, buf, *size, NULL));
  return buf;
}

/* A GPU optimizer saved at step 5 of 10 and loaded into fresh objects continues bit for bit like the
 * run that never stopped; the saved bytes are the CPU layout: they load into a CPU optimizer, which
 * then holds the GPU's masters and states and saves the same bytes again. */
static void gpu_resume_case(const optim_case *c, apex_dtype pdt) {
  enum { P = 2 };
  const size_t sizes[P] = {33, 40001};
  apex_tensor *hp[P], *dp[P], *dp2[P], *dg[P], *hg[P], *at5[P];
  for (int i = 0; i < P; i++) {
    apex_tensor *f = tu_random_tensor(APEX_F32, sizes[i], 300 + i, 1.0f);
    hp[i] = apex_tensor_to(f, pdt);
    dp[i] = dev_copy(hp[i]);
    dp2[i] = dev_copy(hp[i]);
    dg[i] = apex_tensor_create_on(pc_dev, APEX_F16, 1, (int64_t[]){(int64_t)sizes[i]});
    hg[i] = apex_tensor_create(APEX_F16, 1, (int64_t[]){(int64_t)sizes[i]});
    apex_tensor_destroy(f);
  }
  apex_optimizer *a = apex_optimizer_create(c->kind, &c->o), *b = apex_optimizer_create(c->kind, &c->o);
  apex_optimizer *h = apex_optimizer_create(c->kind, &c->o);
  TU_OK(apex_optimizer_add_group(a, dp, P, dg, P, NULL, NULL));
  TU_OK(apex_optimizer_add_group(b, dp2, P, dg, P, NULL, NULL));
  TU_OK(apex_optimizer_add_group(h, hp, P, hg, P, NULL, NULL));
  void *saved = NULL;
  size_t saved_size = 0;
  for (int step = 0; step < 10; step++) {
    if (step == 5) {
      saved = save_state(a, &saved_size);
      for (int i = 0; i < P; i++) at5[i] = host_copy(dp[i]);
    }
    for (int i = 0; i < P; i++) {
      apex_tensor *r = tu_random_tensor(APEX_F32, sizes[i], 7000 + 10 * step + i, 512.0f);
      TU_OK(apex_tensor_copy(dg[i], r));
      apex_tensor_destroy(r);
    }
    TU_OK(apex_optimizer_step(a, 256.0f, 0));
  }
  /* b: fresh parameters given the step-5 values (a checkpoint saves the model), then the state. */
  for (int i = 0; i < P; i++) TU_OK(apex_tensor_copy(dp2[i], at5[i]));
  TU_OK(apex_optimizer_load(b, saved, saved_size));
  for (int step = 5; step < 10; step++) {
    for (int i = 0; i < P; i++) {
      apex_tensor *r = tu_random_tensor(APEX_F32, sizes[i], 7000 + 10 * step + i, 512.0f);
      TU_OK(apex_tensor_copy(dg[i], r));
      apex_tensor_destroy(r);
    }
    TU_OK(apex_optimizer_step(b, 256.0f, 0));
  }
  size_t sa, sb;
  void *ba = save_state(a, &sa), *bb = save_state(b, &sb);
  assert_int_equal(sa, sb);
  if (memcmp(ba, bb, sa)) fail_msg("%s %s: resumed GPU state differs", apex_optim_kind_name(c->kind), apex_dtype_name(pdt));
  for (int i = 0; i < P; i++) {
    apex_tensor *x = host_copy(dp[i]);
    assert_same_bits(dp2[i], x, "resumed GPU parameter");
    apex_tensor_destroy(x);
  }
  /* The GPU's bytes load into the CPU optimizer, which then holds the GPU's masters. An f32 parameter has
   * no master: apex_optimizer_master gives the parameter itself, which the optimizer state does not hold
   * (the model does), so the CPU model first gets the GPU's parameters, as from a checkpoint. (Comparing
   * without them compared the GPU's stepped f32 parameter with the CPU's initial one.) */
  for (int i = 0; i < P; i++) TU_OK(apex_tensor_copy(hp[i], dp[i]));
  TU_OK(apex_optimizer_load(h, ba, sa));
  for (int i = 0; i < P; i++) {
    assert_true((apex_optimizer_master(a, 0, i) == dp[i]) == (pdt == APEX_F32));
    assert_same_bits(apex_optimizer_master(a, 0, i), apex_optimizer_master(h, 0, i), "master loaded on the CPU");
    assert_int_equal(apex_optimizer_step_count(h, 0, i), 10);
  }
  size_t sh;
  void *bh = save_state(h, &sh);
  assert_int_equal(sh, sa);
  if (memcmp(bh, ba, sa)) fail_msg("%s %s: GPU state saved, loaded on the CPU and saved again differs",
                                   apex_optim_kind_name(c->kind), apex_dtype_name(pdt));
  free(saved);
  free(ba);
  free(bb);
  free(bh);
  apex_optimizer_destroy(a);
  apex_optimizer_destroy(b);
  apex_optimizer_destroy(h);
  for (int i = 0; i < P; i++) {
    apex_tensor_destroy(hp[i]);
    apex_tensor_destroy(dp[i]);
    apex_tensor_destroy(dp2[i]);
    apex_tensor_destroy(dg[i]);
    apex_tensor_destroy(hg[i]);
    apex_tensor_destroy(at5[i]);
  }
}

static void pc_optimizer_state_on_gpu(void) {
  const optim_case cases[] = {
      {APEX_OPTIM_SGD, {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-2f}, 0},
      {APEX_OPTIM_ADAMW, {.lr = 1e-2f, .amsgrad = APEX_OPTIM_ON}, 2},
      {APEX_OPTIM_RMSPROP_TF, {.momentum = 0.9f, .centered = APEX_OPTIM_ON}, 0},
      {APEX_OPTIM_LAMB, {.lr = 1e-2f, .weight_decay = 1e-2f}, 64},
      {APEX_OPTIM_NOVOGRAD, {.lr = 1e-2f, .weight_decay = 1e-2f}, 64}, /* its per-tensor moments live on the GPU */
      {APEX_OPTIM_ADAMP, {.weight_decay = 1e-2f}, 64},
  };
  const apex_dtype dts[2] = {APEX_F32, APEX_BF16};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int d = 0; d < 2; d++) gpu_resume_case(&cases[k], dts[d]);
}

/* A fresh optimizer of `kind` over a bf16 copy of f, stepped with the scaler's found_inf set by g's
 * NaN: the parameter keeps its bits and its step count stays 0. */
static void skip_leaves_kind(apex_optim_kind kind, const apex_optim_options *o, const apex_tensor *f, apex_tensor *g,
                             apex_loss_scaler *sc) {
  int64_t n = (int64_t)apex_tensor_numel(f);
  apex_optimizer *opt = apex_optimizer_create(kind, o);
  apex_tensor *p = apex_tensor_create_on(pc_dev, APEX_BF16, 1, &n);
  TU_OK(apex_tensor_copy(p, f));
  TU_OK(apex_optimizer_add_group(opt, &p, 1, &g, 1, NULL, NULL));
  apex_tensor *before = host_copy(p);
  TU_OK(apex_loss_scaler_check(sc, &g, 1));
  TU_OK(apex_optimizer_step_scaled(opt, sc));
  char what[64];
  snprintf(what, sizeof what, "%s model after a skipped step", apex_optim_kind_name(kind));
  assert_same_bits(p, before, what);
  assert_int_equal(apex_optimizer_step_count(opt, 0, 0), 0);
  apex_tensor_destroy(before);
  apex_tensor_destroy(p);
  apex_optimizer_destroy(opt);
}

/* With the device flag set, the step changes nothing: masters, states, model copies, step counts. */
static void pc_device_skip_changes_nothing(void) {
  int64_t n = 50000;
  apex_tensor *f = tu_random_tensor(APEX_F32, (size_t)n, 5, 1.0f);
  apex_tensor *p = apex_tensor_create_on(pc_dev, APEX_BF16, 1, &n);
  TU_OK(apex_tensor_copy(p, f));
  apex_tensor *g = apex_tensor_create_on(pc_dev, APEX_BF16, 1, &n);
  apex_optimizer *opt = apex_optimizer_create(APEX_OPTIM_ADAMW, &(apex_optim_options){.lr = 1e-2f});
  TU_OK(apex_optimizer_add_group(opt, &p, 1, &g, 1, NULL, NULL));
  apex_loss_scaler *sc = apex_loss_scaler_create_on(pc_dev, NULL);
  TU_OK(apex_tensor_copy(g, f));
  TU_OK(apex_loss_scaler_check(sc, &g, 1));
  TU_OK(apex_optimizer_step_scaled(opt, sc)); /* a real step first, so the state is not all zeros */
  TU_OK(apex_loss_scaler_update(sc, 0, NULL));
  apex_tensor *before_p = host_copy(p), *before_m = host_copy(apex_optimizer_master(opt, 0, 0));
  apex_tensor_set(g, 123, NAN);
  TU_OK(apex_loss_scaler_check(sc, &g, 1));
  TU_OK(apex_optimizer_step_scaled(opt, sc));
  TU_OK(apex_loss_scaler_update(sc, 0, NULL));
  assert_same_bits(p, before_p, "model after a skipped step");
  assert_same_bits(apex_optimizer_master(opt, 0, 0), before_m, "master after a skipped step");
  assert_int_equal(apex_optimizer_step_count(opt, 0, 0), 1);
  apex_loss_scaler_state s;
  s = apex_loss_scaler_get_state(sc);
  assert_true(s.scale == 32768.0f && s.skipped == 1 && s.steps == 2);
  /* The kinds with passes of their own (LAMB's norms, AdamP's row sums) skip from the device flag too:
   * g still holds the NaN. */
  skip_leaves_kind(APEX_OPTIM_LAMB, &(apex_optim_options){.lr = 1e-2f, .weight_decay = 1e-2f}, f, g, sc);
  skip_leaves_kind(APEX_OPTIM_ADAMP, &(apex_optim_options){.weight_decay = 1e-2f}, f, g, sc);
  apex_optimizer *adamp = apex_optimizer_create(APEX_OPTIM_ADAMP, NULL);
  /* A group mixing devices: refused at add time. */
  apex_tensor *hp = apex_tensor_create(APEX_F32, 1, &n), *dp2 = apex_tensor_create_on(pc_dev, APEX_F32, 1, &n);
  apex_tensor *mixed[2] = {dp2, hp};
  TU_FAILS(apex_optimizer_add_group(adamp, mixed, 2, NULL, 0, NULL, NULL), APEX_ERR_DEVICE, "parameter 1 is on the CPU");
  apex_optimizer_destroy(adamp);
  apex_tensor_destroy(dp2);
  apex_tensor_destroy(hp);
  apex_tensor_destroy(before_p);
  apex_tensor_destroy(before_m);
  apex_loss_scaler_destroy(sc);
  apex_optimizer_destroy(opt);
  apex_tensor_destroy(g);
  apex_tensor_destroy(p);
  apex_tensor_destroy(f);
}

/* ---- fused kernels against double-precision references ------------------------------------------------ */

#endif
