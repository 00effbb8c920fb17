/* checkpoint.c: atomic, deterministic, verified checkpoints (layout in checkpoint.h). */
#include "report.h"
#include "checkpoint.h"
#include "device.h"
#include "fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FORMAT "apex-train checkpoint 1"

/* The flag a load is for, named in its messages (ckpt_set_context). */
static const char *ckpt_ctx = "--resume";
void ckpt_set_context(const char *flag) { ckpt_ctx = flag; }

void ckpt_config_add(ckpt_config *c, const char *key, const char *fmt, ...) {
  if (c->n >= CKPT_NCONFIG) return;
  va_list ap;
  va_start(ap, fmt);
  c->key[c->n] = key;
  vsnprintf(c->value[c->n], sizeof c->value[c->n], fmt, ap);
  va_end(ap);
  c->is_float[c->n] = 0;
  c->n++;
}

/* v in the fewest significant digits that read back as the same f32. */
static void format_f32(char *out, size_t cap, float v) {
  for (int digits = 1; digits <= 9; digits++) {
    snprintf(out, cap, "%.*g", digits, (double)v);
    if (strtof(out, NULL) == v) return;
  }
}

void ckpt_config_add_float(ckpt_config *c, const char *key, float v) {
  if (c->n >= CKPT_NCONFIG) return;
  c->key[c->n] = key;
  format_f32(c->value[c->n], sizeof c->value[c->n], v);
  c->is_float[c->n] = 1;
  c->n++;
}

/* The checkpoint's value `saved` of entry i, as this run's would be written (for the message), and
 * whether it matches. */
static int config_matches(const ckpt_config *c, int i, const char *saved, char *shown, size_t cap) {
  snprintf(shown, cap, "%s", saved);
  if (!c->is_float[i]) return strcmp(saved, c->value[i]) == 0;
  char *end;
  float v = strtof(saved, &end);
  if (end == saved || *end) return 0;
  format_f32(shown, cap, v);
  return v == strtof(c->value[i], NULL);
}


static uint64_t fnv1a(const uint8_t *p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
#define FNV_INIT 0xcbf29ce484222325ull

/* ---- files ------------------------------------------------------------------------------------------ */

static int fsync_path(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

/* Writes buf to path through path.tmp, fsync and rename. */
static int write_atomic(const char *path, const void *buf, size_t len) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  const uint8_t *p = buf;
  size_t done = 0;
  while (done < len) {
    ssize_t w = write(fd, p + done, len - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      break;
    }
    done += (size_t)w;
  }
  int ok = done == len && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  if (ok && rename(tmp, path) == 0) return 0;
  int e = errno;
  unlink(tmp);
  errno = e;
  return -1;
}

/* Removes a step directory (only plain files inside). */
static void remove_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(path);
}

int ckpt_exists(const char *dir) {
  char p[4200];
  snprintf(p, sizeof p, "%s/latest", dir);
  return access(p, F_OK) == 0;
}

int ckpt_prepare_dir(const char *dir, int *created) {
  char path[4200];
  *created = 0;
  if (!dir[0] || strlen(dir) >= sizeof path) {
    fprintf(stderr, "apex-train: --checkpoint '%s': not a usable directory name\n", dir);
    return 1;
  }
  snprintf(path, sizeof path, "%s", dir);
  /* Each prefix ending before a '/', then dir itself: made when absent. */
  for (char *c = path + 1;; c++) {
    if (*c != '/' && *c) continue;
    char keep = *c;
    *c = 0;
    struct stat st;
    const char *why = NULL;
    if (stat(path, &st) == 0) {
      if (!S_ISDIR(st.st_mode)) why = "is not a directory";
    } else if (errno != ENOENT || mkdir(path, 0755) != 0) {
      why = strerror(errno);
    } else {
      (*created)++;
    }
    if (why) {
      if (keep) fprintf(stderr, "apex-train: --checkpoint %s: %s %s%s\n", dir, path, why[0] == 'i' ? "" : "cannot be created: ", why);
      else fprintf(stderr, "apex-train: --checkpoint %s %s%s\n", dir, why[0] == 'i' ? "" : "cannot be created: ", why);
      ckpt_unprepare_dir(dir, *created);
      *created = 0;
      return 1;
    }
    *c = keep;
    if (!keep) break;
  }
  char probe[4300];
  snprintf(probe, sizeof probe, "%s/.apex-train-probe", dir);
  int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    int e = errno;
    ckpt_unprepare_dir(dir, *created);
    *created = 0;
    fprintf(stderr, "apex-train: --checkpoint %s is not writable: %s\n", dir, strerror(e));
    return 1;
  }
  close(fd);
  unlink(probe);
  return 0;
}

void ckpt_unprepare_dir(const char *dir, int created) {
  char path[4200];
  snprintf(path, sizeof path, "%s", dir);
  for (int i = 0; i < created; i++) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') path[--n] = 0;
    if (rmdir(path) != 0) return;
    char *slash = strrchr(path, '/');
    if (!slash) return;
    *slash = 0;
  }
}

/* ---- the state's metadata ------------------------------------------------------------------------ */

typedef struct meta {
  const char *key[64];
  char *value[64];
  int n;
} meta;

static void meta_add(meta *m, const char *key, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *v = malloc((size_t)len + 1);
  va_start(ap, fmt);
  vsnprintf(v, (size_t)len + 1, fmt, ap);
  va_end(ap);
  m->key[m->n] = key;
  m->value[m->n++] = v;
}

static void meta_free(meta *m) {
  for (int i = 0; i < m->n; i++) free(m->value[i]);
  m->n = 0;
}

/* "name[2,3];..." for every parameter and buffer. */
static char *shapes_string(const train_model *tm) {
  size_t cap = 1 << 14, at = 0;
  char *s = malloc(cap);
  s[0] = 0;
  size_t np = apex_model_num_params(tm->m), nb = apex_model_num_buffers(tm->m);
  for (size_t i = 0; i < np + nb; i++) {
    const char *name;
    apex_tensor *t = i < np ? apex_var_value(apex_model_param(tm->m, i, &name)) : apex_model_buffer(tm->m, i - np, &name);
    char sh[128];
    apex_tensor_shape_str(t, sh, sizeof sh);
    size_t need = strlen(name) + strlen(sh) + 4;
    if (at + need >= cap) s = realloc(s, cap = 2 * cap + need);
    at += (size_t)sprintf(s + at, "%s%s%s", at ? ";" : "", name, sh);
  }
  return s;
}

/* The checksum of every metadata entry but "checksum", in order. */
static uint64_t meta_checksum(const char *const *keys, const char *const *values, int n) {
  uint64_t h = FNV_INIT;
  for (int i = 0; i < n; i++) {
    if (strcmp(keys[i], "checksum") == 0) continue;
    h = fnv1a((const uint8_t *)keys[i], strlen(keys[i]), h);
    h = fnv1a((const uint8_t *)"=", 1, h);
    h = fnv1a((const uint8_t *)values[i], strlen(values[i]), h);
    h = fnv1a((const uint8_t *)"\n", 1, h);
  }
  return h;
}

/* The keys of state.safetensors after the configuration's, in order. */
static const char *const state_keys[] = {"format", "shapes", "step", "epoch", "position", "model_rng_seed",
                                         "model_rng_offset", "amp_state", "model_fnv1a64", "optimizer_fnv1a64"};
#define N_STATE_KEYS (sizeof state_keys / sizeof state_keys[0])

/* ---- save ---------------------------------------------------------------------------------------- */

static int save_model(const char *path, const train_model *tm, apex_optimizer *opt) {
  size_t np = apex_model_num_params(tm->m), nb = apex_model_num_buffers(tm->m), n = np + nb;
  const char **names = calloc(n, sizeof *names);
  apex_tensor **ts = calloc(n, sizeof *ts), **owned = calloc(n, sizeof *owned);
  int rc = -1;
  if (!names || !ts || !owned) goto done;
  for (size_t i = 0; i < np; i++) {
    apex_model_param(tm->m, i, &names[i]);
    apex_tensor *t = apex_optimizer_master(opt, 0, (int)i); /* the f32 master, or the parameter */
    if (!t) goto done;
    if (apex_tensor_dtype(t) != APEX_F32) t = owned[i] = apex_tensor_to(t, APEX_F32);
    if (!t) goto done;
    ts[i] = t;
  }
  for (size_t j = 0; j < nb; j++) ts[np + j] = apex_model_buffer(tm->m, j, &names[np + j]);
  /* How the images' bytes became the model's input, for whoever runs the weights elsewhere. */
  const char *mk[3] = {"format", "model", "input"},
             *mv[3] = {FORMAT, model_kind_name(tm->kind), "pixels p (0..255) scaled to p / 255 * 2 - 1, in [-1, 1]"};
  rc = apex_safetensors_save(path, names, ts, (int)n, mk, mv, tm->kind == MODEL_GPT ? 2 : 3) == APEX_OK ? 0 : -1;
done:
  for (size_t i = 0; owned && i < n; i++) apex_tensor_destroy(owned[i]);
  free(owned);
  free(ts);
  free(names);
  return rc;
}

/* The optimizer's state (apex_optimizer_save) in a new buffer; NULL on failure. */
static uint8_t *optimizer_bytes(apex_optimizer *opt, size_t *len) {
  uint8_t *b = NULL;
  if (apex_optimizer_state_size(opt, len) != APEX_OK || !(b = malloc(*len ? *len : 1)) || apex_optimizer_save(opt, b, *len, len) != APEX_OK) {
    free(b);
    return NULL;
  }
  return b;
}

int ckpt_save(const char *dir, const train_model *tm, apex_amp *amp, apex_optimizer *opt, const ckpt_config *cfg,
              const ckpt_position *p) {
  char partial[4200], final[4200], path[4300], prev[256] = "";
  snprintf(partial, sizeof partial, "%s/step-%ld.partial", dir, p->step);
  snprintf(final, sizeof final, "%s/step-%ld", dir, p->step);
  /* The directory latest names now survives this save. */
  snprintf(path, sizeof path, "%s/latest", dir);
  size_t llen;
  uint8_t *lb = file_read_all(path, &llen, 0);
  if (lb) {
    snprintf(prev, sizeof prev, "%.*s", (int)(llen < 200 ? llen : 200), (char *)lb);
    prev[strcspn(prev, "\n")] = 0;
    free(lb);
  }
  if (strcmp(prev, final + strlen(dir) + 1) == 0) return 0; /* this state is the latest checkpoint already */

  remove_dir(partial);
  apex_clear_error(); /* a message from before is not this save's */
  const char *what = "create";
  meta m = {0};
  uint8_t *ob = NULL, *mb = NULL;
  if (mkdir(partial, 0755) != 0) goto fail;
  what = "write model.safetensors in";
  snprintf(path, sizeof path, "%s/model.safetensors", partial);
  if (save_model(path, tm, opt) != 0) goto fail;
  size_t mlen;
  mb = file_read_all(path, &mlen, 0);
  if (!mb) goto fail;
  what = "write optimizer.bin in";
  size_t olen;
  if (!(ob = optimizer_bytes(opt, &olen))) goto fail;
  snprintf(path, sizeof path, "%s/optimizer.bin", partial);
  if (write_atomic(path, ob, olen) != 0) goto fail;

  what = "write state.safetensors in";
  size_t alen = apex_amp_state_size(amp);
  uint8_t abuf[4096];
  if (alen > sizeof abuf || apex_amp_state_save(amp, abuf, alen) != APEX_OK) goto fail;
  char hex[8193];
  for (size_t i = 0; i < alen; i++) sprintf(hex + 2 * i, "%02x", abuf[i]);
  hex[2 * alen] = 0;
  for (int i = 0; i < cfg->n; i++) meta_add(&m, cfg->key[i], "%s", cfg->value[i]);
  char *shapes = shapes_string(tm);
  apex_rng *mr = apex_model_rng(tm->m);
  meta_add(&m, "format", "%s", FORMAT);
  meta_add(&m, "shapes", "%s", shapes);
  free(shapes);
  meta_add(&m, "step", "%ld", p->step);
  meta_add(&m, "epoch", "%ld", p->epoch);
  meta_add(&m, "position", "%ld", p->pos);
  meta_add(&m, "model_rng_seed", "%llu", (unsigned long long)mr->seed);
  meta_add(&m, "model_rng_offset", "%llu", (unsigned long long)mr->offset);
  meta_add(&m, "amp_state", "%s", hex);
  meta_add(&m, "model_fnv1a64", "%016llx", (unsigned long long)fnv1a(mb, mlen, FNV_INIT));
  meta_add(&m, "optimizer_fnv1a64", "%016llx", (unsigned long long)fnv1a(ob, olen, FNV_INIT));
  if (p->lr_total > 0) meta_add(&m, "lr_schedule_total", "%ld", p->lr_total);
  meta_add(&m, "checksum", "%016llx",
           (unsigned long long)meta_checksum(m.key, (const char *const *)m.value, m.n));
  snprintf(path, sizeof path, "%s/state.safetensors", partial);
  if (apex_safetensors_save(path, NULL, NULL, 0, m.key, (const char *const *)m.value, m.n) != APEX_OK) goto fail;

  what = "write timing.json in";
  char timing[64];
  int tl = snprintf(timing, sizeof timing, "{\"elapsed_s\": %.3f}\n", p->elapsed_s);
  snprintf(path, sizeof path, "%s/timing.json", partial);
  if (write_atomic(path, timing, (size_t)tl) != 0) goto fail;

  what = "publish";
  if (fsync_path(partial) != 0) goto fail;
  remove_dir(final); /* a stale one from an abandoned run; never the latest (checked above) */
  if (rename(partial, final) != 0 || fsync_path(dir) != 0) goto fail;
  snprintf(path, sizeof path, "%s/latest", dir);
  char line[256];
  int ll = snprintf(line, sizeof line, "step-%ld\n", p->step);
  if (write_atomic(path, line, (size_t)ll) != 0 || fsync_path(dir) != 0) goto fail;

  /* Older checkpoints go; the previous one stays. */
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (strncmp(e->d_name, "step-", 5) != 0 || strcmp(e->d_name, final + strlen(dir) + 1) == 0 ||
          strcmp(e->d_name, prev) == 0)
        continue;
      char old[4400];
      snprintf(old, sizeof old, "%s/%s", dir, e->d_name);
      remove_dir(old);
    }
    closedir(d);
  }
  meta_free(&m);
  free(ob);
  free(mb);
  return 0;

fail:;
  int e = errno;
  const char *msg = apex_last_error();
  /* What survived, and what to do: the previous checkpoint is untouched by a failed save. */
  char kept[4400] = "no earlier checkpoint";
  int full = e == ENOSPC || e == EDQUOT || e == EFBIG;
  if (prev[0]) snprintf(kept, sizeof kept, "%s/%s is intact: %sadd --resume to continue from it", dir, prev, full ? "free space and " : "");
  /* A full disk is said by errno alone: the library's message would name the path again. */
  fprintf(stderr, "apex-train: cannot %s %s: %s; %s\n", what, partial, !full && msg && msg[0] ? one_line(msg) : strerror(e), kept);
  remove_dir(partial);
  meta_free(&m);
  free(ob);
  free(mb);
  return 1;
}

/* ---- load ---------------------------------------------------------------------------------------- */

static int hex_decode(const char *hex, uint8_t *out, size_t cap, size_t *len) {
  size_t n = strlen(hex);
  if (n % 2 || n / 2 > cap) return -1;
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
    out[i] = (uint8_t)v;
  }
  *len = n / 2;
  return 0;
}

/* The first entry where two "name[shape];..." lists differ, for the message. */
static void first_difference(const char *a, const char *b, char *out, size_t size) {
  while (*a || *b) {
    size_t la = strcspn(a, ";"), lb = strcspn(b, ";");
    if (la != lb || strncmp(a, b, la) != 0) {
      snprintf(out, size, "the checkpoint has %.*s where this model has %.*s", (int)(la ? la : 6), la ? a : "nothing",
               (int)(lb ? lb : 7), lb ? b : "nothing");
      return;
    }
    a += la + (a[la] == ';');
    b += lb + (b[lb] == ';');
  }
  snprintf(out, size, "different tensors");
}

/* --resume at another number of ranks. A step trains on the global batch, world_size x batch_size
 * consecutive items of the epoch's permutation (dataset.h), so a run that keeps the global batch
 * sees the same samples at every step and the same steps per epoch: 2 ranks of --batch-size 6 resume
 * as 3 of 4 or 1 of 12. The state in the files is unsharded (a --zero run consolidates it), so any
 * number of ranks loads it. What changes is only how the batch is split: the gradient is the average
 * of other per-rank means, so the run continues as a DDP run at the new world size would from the
 * same checkpoint, not with the bits of the old world size. 1: world_size or batch_size differ but
 * the global batch agrees (the two keys are then not compared); 0: neither differs or another flag
 * than --resume; -1 after one line when the global batch differs. */
static int resume_regroups(const ckpt_config *cfg, const char *const *values, const char *where) {
  int w = -1, b = -1;
  for (int i = 0; i < cfg->n; i++) {
    if (strcmp(cfg->key[i], "world_size") == 0) w = i;
    if (strcmp(cfg->key[i], "batch_size") == 0) b = i;
  }
  if (w < 0 || b < 0 || strcmp(ckpt_ctx, "--resume") != 0) return 0;
  if (strcmp(values[w], cfg->value[w]) == 0 && strcmp(values[b], cfg->value[b]) == 0) return 0;
  long sw = strtol(values[w], NULL, 10), sb = strtol(values[b], NULL, 10);
  long nw = strtol(cfg->value[w], NULL, 10), nb = strtol(cfg->value[b], NULL, 10);
  if (sw > 0 && sb > 0 && sw * sb == nw * nb) return 1;
  char how[160];
  if (sw > 0 && sb > 0 && (sw * sb) % nw == 0)
    snprintf(how, sizeof how, "resume with --batch-size %ld (%ld x %ld = %ld)", sw * sb / nw, nw, sw * sb / nw, sw * sb);
  else
    snprintf(how, sizeof how, "no --batch-size gives it on %ld rank(s): resume on a number of ranks that divides %ld", nw, sw * sb);
  fprintf(stderr, "apex-train: --resume: checkpoint %s trained on a global batch of %ld (%ld rank(s) x --batch-size %ld), this run on %ld "
          "(%ld x %ld); a step must see the same samples: %s, or use another --checkpoint directory\n",
          where, sw * sb, sw, sb, nw * nb, nw, nb, how);
  return -1;
}

int ckpt_load(const char *dir, train_model *tm, apex_amp *amp, apex_optimizer *opt, const ckpt_config *cfg, ckpt_position *p) {
  char path[4700], sub[256], where[4400];
  apex_safetensors *st = NULL, *ms = NULL;
  uint8_t *mb = NULL, *ob = NULL;
  char *shapes = NULL;
  int rc = 1;
  snprintf(path, sizeof path, "%s/latest", dir);
  size_t len;
  uint8_t *lb = file_read_all(path, &len, 0);
  if (!lb) {
    fprintf(stderr, "apex-train: %s: no checkpoint in %s (no %s); train without --resume first\n", ckpt_ctx, dir, path);
    return 1;
  }
  long step_named = -1;
  char tail = 0;
  int ok = len > 0 && len < sizeof sub;
  if (ok) {
    memcpy(sub, lb, len);
    sub[len] = 0;
    sub[strcspn(sub, "\n")] = 0;
    ok = sscanf(sub, "step-%ld%c", &step_named, &tail) == 1 && step_named >= 0;
  }
  free(lb);
  if (!ok) {
    fprintf(stderr, "apex-train: %s: %s is corrupted (it should name a step-<N> directory)\n", ckpt_ctx, path);
    return 1;
  }
  snprintf(where, sizeof where, "%s/%s", dir, sub);
  snprintf(path, sizeof path, "%s/state.safetensors", where);
  st = apex_safetensors_open(path);
  if (!st) {
    fprintf(stderr, "apex-train: %s: checkpoint %s is unreadable or corrupted: %s\n", ckpt_ctx, where, one_line(apex_last_error()));
    goto done;
  }
  /* Every key present, the checksum right. */
  const char *keys[64], *values[64];
  int nk = 0;
  for (int i = 0; i < cfg->n; i++) keys[nk++] = cfg->key[i];
  for (size_t i = 0; i < N_STATE_KEYS; i++) keys[nk++] = state_keys[i];
  int has_total = apex_safetensors_metadata(st, "lr_schedule_total") != NULL;
  if (has_total) keys[nk++] = "lr_schedule_total";
  keys[nk++] = "checksum";
  for (int i = 0; i < nk; i++) {
    values[i] = apex_safetensors_metadata(st, keys[i]);
    if (!values[i]) {
      fprintf(stderr, "apex-train: %s: %s/state.safetensors is corrupted or not from this version of apex-train (no '%s' in it)\n", ckpt_ctx,
              where, keys[i]);
      goto done;
    }
  }
  char sum[32];
  snprintf(sum, sizeof sum, "%016llx", (unsigned long long)meta_checksum(keys, values, nk));
  if (strcmp(sum, values[nk - 1]) != 0 || strcmp(values[cfg->n], FORMAT) != 0) {
    fprintf(stderr, "apex-train: %s: %s/state.safetensors is corrupted (its checksum does not match)\n", ckpt_ctx, where);
    goto done;
  }
  int regroup = resume_regroups(cfg, values, where);
  if (regroup < 0) goto done;
  char shown[64];
  for (int i = 0; i < cfg->n; i++)
    if (!config_matches(cfg, i, values[i], shown, sizeof shown)) {
      if (regroup && (strcmp(cfg->key[i], "world_size") == 0 || strcmp(cfg->key[i], "batch_size") == 0)) continue;
      /* Evaluating or sampling trains nothing: any number of processes may load a checkpoint for it. */
      if (strcmp(ckpt_ctx, "--resume") != 0 && strcmp(cfg->key[i], "world_size") == 0) continue;
      /* The world size is not a flag: say how to get the checkpoint's. */
      char how[128] = "resume with the same flags";
      if (strcmp(ckpt_ctx, "--resume") != 0) {
        /* --eval-only, --sample: the configuration comes from the checkpoint; a flag given anyway differs. */
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", cfg->key[i]);
        for (char *c = flag + 2; *c; c++)
          if (*c == '_') *c = '-';
        fprintf(stderr, "apex-train: %s: checkpoint %s was made with %s %s, this run gives %s %s; drop %s (the checkpoint's configuration is used)\n",
                ckpt_ctx, where, flag, shown, flag, cfg->value[i], flag);
        goto done;
      }
      if (strcmp(cfg->key[i], "world_size") == 0)
        snprintf(how, sizeof how, strcmp(values[i], "1") == 0 ? "resume with a single process" : "resume with `mpirun -np %s ... --distributed`",
                 values[i]);
      fprintf(stderr, "apex-train: %s: checkpoint %s was made with %s %s, this run has %s %s; %s or use another --checkpoint directory\n", ckpt_ctx,
              where, cfg->key[i], shown, cfg->key[i], cfg->value[i], how);
      goto done;
    }
  shapes = shapes_string(tm);
  if (strcmp(shapes, values[cfg->n + 1]) != 0) {
    char diff[512];
    first_difference(values[cfg->n + 1], shapes, diff, sizeof diff);
    fprintf(stderr, "apex-train: %s: checkpoint %s does not fit this model: %s\n", ckpt_ctx, where, diff);
    goto done;
  }
  /* The other two files, whole. */
  snprintf(path, sizeof path, "%s/model.safetensors", where);
  size_t mlen, olen;
  mb = file_read_all(path, &mlen, 0);
  snprintf(sum, sizeof sum, "%016llx", mb ? (unsigned long long)fnv1a(mb, mlen, FNV_INIT) : 0ull);
  if (!mb || strcmp(sum, values[cfg->n + 8]) != 0) {
    fprintf(stderr, "apex-train: %s: %s is %s\n", ckpt_ctx, path, mb ? "corrupted or truncated (its hash does not match the state's)" : "missing or unreadable");
    goto done;
  }
  snprintf(path, sizeof path, "%s/optimizer.bin", where);
  ob = file_read_all(path, &olen, 0);
  snprintf(sum, sizeof sum, "%016llx", ob ? (unsigned long long)fnv1a(ob, olen, FNV_INIT) : 0ull);
  if (!ob || strcmp(sum, values[cfg->n + 9]) != 0) {
    fprintf(stderr, "apex-train: %s: %s is %s\n", ckpt_ctx, path, ob ? "corrupted or truncated (its hash does not match the state's)" : "missing or unreadable");
    goto done;
  }
  uint8_t amp_buf[4096];
  size_t alen;
  char *endp;
  unsigned long long rseed = strtoull(values[cfg->n + 5], &endp, 10), roff = strtoull(values[cfg->n + 6], &endp, 10);
  p->step = strtol(values[cfg->n + 2], &endp, 10);
  p->epoch = strtol(values[cfg->n + 3], &endp, 10);
  p->pos = strtol(values[cfg->n + 4], &endp, 10);
  p->lr_total = has_total ? strtol(values[nk - 2], &endp, 10) : 0;
  if (has_total && (*endp || p->lr_total <= 0)) {
    fprintf(stderr, "apex-train: %s: %s/state.safetensors is inconsistent (lr_schedule_total)\n", ckpt_ctx, where);
    goto done;
  }
  if (hex_decode(values[cfg->n + 7], amp_buf, sizeof amp_buf, &alen) != 0 || p->step != step_named) {
    fprintf(stderr, "apex-train: %s: %s/state.safetensors is inconsistent (amp state or step)\n", ckpt_ctx, where);
    goto done;
  }
  ms = apex_safetensors_parse(mb, mlen);
  if (!ms) {
    fprintf(stderr, "apex-train: %s: %s/model.safetensors is corrupted: %s\n", ckpt_ctx, where, one_line(apex_last_error()));
    goto done;
  }
  /* Restore: weights (converted to the parameters' dtype), buffers, optimizer (which rewrites f16/bf16
   * parameters from their masters), amp's scalers, the dropout generator. */
  size_t np = apex_model_num_params(tm->m), nb = apex_model_num_buffers(tm->m);
  for (size_t i = 0; i < np + nb; i++) {
    const char *name;
    apex_tensor *dst = i < np ? apex_var_value(apex_model_param(tm->m, i, &name)) : apex_model_buffer(tm->m, i - np, &name);
    apex_tensor *src = apex_safetensors_get(ms, name);
    apex_status s = src ? (apex_tensor_same_shape(src, dst) && apex_tensor_dtype(src) == APEX_F32 ? apex_tensor_copy(dst, src) : APEX_ERR_SHAPE)
                        : APEX_ERR_INVALID_ARG;
    apex_tensor_destroy(src);
    if (s != APEX_OK) {
      fprintf(stderr, "apex-train: %s: %s/model.safetensors: tensor %s is missing or not f32 of its shape\n", ckpt_ctx, where, name);
      goto done;
    }
  }
  if (apex_optimizer_load(opt, ob, olen) != APEX_OK) {
    fprintf(stderr, "apex-train: %s: %s/optimizer.bin does not fit this optimizer: %s\n", ckpt_ctx, where, one_line(apex_last_error()));
    goto done;
  }
  if (apex_amp_state_load(amp, amp_buf, alen) != APEX_OK) {
    fprintf(stderr, "apex-train: %s: the amp state of %s does not fit: %s\n", ckpt_ctx, where, one_line(apex_last_error()));
    goto done;
  }
  /* Training time so far: absent in checkpoints older than timing.json. */
  snprintf(path, sizeof path, "%s/timing.json", where);
  p->elapsed_s = 0;
  size_t tlen;
  uint8_t *tb = file_read_all(path, &tlen, 0);
  if (tb) {
    char text[128];
    snprintf(text, sizeof text, "%.*s", (int)(tlen < 127 ? tlen : 127), (char *)tb);
    free(tb);
    if (sscanf(text, " {\"elapsed_s\": %lf }", &p->elapsed_s) != 1 || !(p->elapsed_s >= 0)) {
      fprintf(stderr, "apex-train: %s: %s is corrupted (it should hold {\"elapsed_s\": seconds}); delete it to resume with the time reset\n", ckpt_ctx, path);
      goto done;
    }
  } else if (errno != ENOENT) {
    fprintf(stderr, "apex-train: %s: cannot read %s: %s\n", ckpt_ctx, path, strerror(errno));
    goto done;
  }
  apex_model_rng(tm->m)->seed = rseed;
  apex_model_rng(tm->m)->offset = roff;
  rc = 0;
done:
  apex_safetensors_close(st);
  apex_safetensors_close(ms);
  free(mb);
  free(ob);
  free(shapes);
  return rc;
}

/* ---- the state's hash ------------------------------------------------------------------------------ */

/* A GPU tensor is hashed from a host copy: the same bytes, so that ranks and devices compare. A copy
 * that fails hashes as nothing, which differs from any state that has the tensor. */
static uint64_t hash_tensor(const apex_tensor *t, uint64_t h) {
  int owned;
  apex_tensor *host = device_to_host(t, &owned);
  if (host) h = fnv1a(apex_tensor_data(host), apex_tensor_nbytes(host), h);
  if (owned) apex_tensor_destroy(host);
  return h;
}

int ckpt_state_hash(const train_model *tm, apex_amp *amp, apex_optimizer *opt, uint64_t *hash) {
  uint64_t h = FNV_INIT;
  size_t np = apex_model_num_params(tm->m), nb = apex_model_num_buffers(tm->m);
  for (size_t i = 0; i < np; i++) {
    h = hash_tensor(apex_var_value(apex_model_param(tm->m, i, NULL)), h);
    const apex_tensor *master = apex_optimizer_master(opt, 0, (int)i);
    if (master) h = hash_tensor(master, h);
  }
  for (size_t j = 0; j < nb; j++) h = hash_tensor(apex_model_buffer(tm->m, j, NULL), h);
  size_t olen, alen = apex_amp_state_size(amp);
  uint8_t abuf[4096], *ob = optimizer_bytes(opt, &olen);
  if (!ob || alen > sizeof abuf || apex_amp_state_save(amp, abuf, alen) != APEX_OK) {
    free(ob);
    return 1;
  }
  h = fnv1a(ob, olen, h);
  h = fnv1a(abuf, alen, h);
  free(ob);
  const apex_rng *r = apex_model_rng(tm->m);
  uint64_t rs[2] = {r->seed, r->offset};
  *hash = fnv1a((const uint8_t *)rs, sizeof rs, h);
  return 0;
}
