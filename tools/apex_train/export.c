/* export.c: apex-train export (export.h). The checkpoint's latest step is read as apex-train wrote it:
 * the GPT's sizes from its tensors' shapes, the head count from state.safetensors (n_head), the
 * weights through the library's loader, which checks every name and shape. */
#include "export.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apex/apex.h"
#include "fileio.h"
#include "report.h" /* one_line */

static void usage(FILE *out) {
  fprintf(out, "usage: apex-train export --format hf --checkpoint DIR --out OUT\n"
               "  writes the GPT in checkpoint DIR (its latest step) as a Hugging Face GPT2LMHeadModel:\n"
               "  OUT/model.safetensors and OUT/config.json (OUT is made if absent; its parent must exist)\n"
               "  --format hf        the only format (Transformers' GPT-2 layout)\n"
               "  --checkpoint DIR   a checkpoint directory apex-train --model gpt wrote\n"
               "  --out OUT          the output directory\n"
               "  --n-head N         the head count, for a checkpoint that does not record it\n");
}

/* The latest step's directory of checkpoint dir into out; 0, or 1 after one line. */
static int latest_dir(const char *dir, char *out, size_t cap) {
  char path[4200], sub[256];
  snprintf(path, sizeof path, "%s/latest", dir);
  size_t len;
  uint8_t *lb = file_read_all(path, &len, 4096);
  if (!lb) {
    fprintf(stderr, "apex-train export: --checkpoint %s: no checkpoint there (%s: %s)\n", dir, path, strerror(errno));
    return 1;
  }
  snprintf(sub, sizeof sub, "%.*s", (int)(len < 200 ? len : 200), (char *)lb);
  free(lb);
  sub[strcspn(sub, "\n")] = 0;
  snprintf(out, cap, "%s/%s", dir, sub);
  return 0;
}

/* The GPT's sizes from the shapes of an apex-train model file; 0, or 1 after one line. */
static int sizes_from(const apex_safetensors *st, const char *path, apex_gpt_options *o) {
  const char *kind = apex_safetensors_metadata(st, "model");
  if ((kind && strcmp(kind, "gpt")) || !apex_safetensors_has(st, "wte.weight")) {
    fprintf(stderr, "apex-train export: %s holds %s%s, not a gpt: only a GPT exports as a Hugging Face GPT-2\n", path, kind ? "a " : "no apex-train GPT",
            kind ? kind : "");
    return 1;
  }
  apex_tensor *wte = apex_safetensors_get(st, "wte.weight"), *wpe = apex_safetensors_get(st, "wpe.weight");
  int ok = wte && wpe && apex_tensor_ndim(wte) == 2 && apex_tensor_ndim(wpe) == 2;
  if (ok) {
    o->vocab = apex_tensor_dim(wte, 0);
    o->n_embd = apex_tensor_dim(wte, 1);
    o->n_positions = apex_tensor_dim(wpe, 0);
    char name[64];
    for (o->n_layer = 0;; o->n_layer++) {
      snprintf(name, sizeof name, "h%lld.ln1.weight", (long long)o->n_layer);
      if (!apex_safetensors_has(st, name)) break;
    }
  }
  apex_tensor_destroy(wte);
  apex_tensor_destroy(wpe);
  if (!ok || o->n_layer == 0) {
    fprintf(stderr, "apex-train export: %s: the GPT's wte.weight, wpe.weight or h0 block is missing or not 2-d\n", path);
    return 1;
  }
  return 0;
}

int export_main(int argc, char **argv) {
  const char *format = NULL, *ck = NULL, *out = NULL;
  long n_head = 0;
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
      usage(stdout);
      return 0;
    }
    const char **slot = !strcmp(f, "--format") ? &format : !strcmp(f, "--checkpoint") ? &ck : !strcmp(f, "--out") ? &out : NULL;
    if (!slot && strcmp(f, "--n-head")) {
      fprintf(stderr, "apex-train export: unknown argument '%s' (see apex-train export --help)\n", f);
      return 2;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "apex-train export: %s needs a value\n", f);
      return 2;
    }
    if (slot) {
      *slot = argv[++i];
    } else {
      char *end;
      n_head = strtol(argv[++i], &end, 10);
      if (*end || end == argv[i] || n_head < 1 || n_head > 1 << 20) {
        fprintf(stderr, "apex-train export: --n-head '%s': give a whole number >= 1\n", argv[i]);
        return 2;
      }
    }
  }
  if (!format || strcmp(format, "hf")) {
    fprintf(stderr, "apex-train export: --format %s: the one format is hf (give --format hf)\n", format ? format : "missing");
    return 2;
  }
  if (!ck || !out) {
    fprintf(stderr, "apex-train export: give --checkpoint DIR and --out OUT\n");
    return 2;
  }
  char step[4400], path[4500];
  if (latest_dir(ck, step, sizeof step)) return 1;
  snprintf(path, sizeof path, "%s/model.safetensors", step);
  apex_safetensors *st = apex_safetensors_open(path);
  if (!st) {
    fprintf(stderr, "apex-train export: %s\n", one_line(apex_last_error()));
    return 1;
  }
  apex_gpt_options o = {0};
  int rc = sizes_from(st, path, &o);
  apex_safetensors_close(st);
  if (rc) return rc;
  if (!n_head) {
    snprintf(path, sizeof path, "%s/state.safetensors", step);
    apex_safetensors *s2 = apex_safetensors_open(path);
    const char *h = s2 ? apex_safetensors_metadata(s2, "n_head") : NULL;
    n_head = h ? atol(h) : 0;
    apex_safetensors_close(s2);
    apex_clear_error();
    if (n_head < 1) {
      fprintf(stderr, "apex-train export: %s records no n_head; give --n-head\n", path);
      return 1;
    }
  }
  if (o.n_embd % n_head) {
    fprintf(stderr, "apex-train export: n_head %ld does not divide the width %lld of %s\n", n_head, (long long)o.n_embd, step);
    return 1;
  }
  o.n_head = n_head;
  apex_model *m = apex_model_create(NULL);
  apex_module *gpt = m ? apex_gpt_create(m, &o) : NULL;
  snprintf(path, sizeof path, "%s/model.safetensors", step);
  rc = !gpt || apex_model_load_f32(m, NULL, path) != APEX_OK || apex_gpt_save_hf(m, gpt, NULL, out) != APEX_OK;
  if (rc)
    fprintf(stderr, "apex-train export: %s\n", one_line(apex_last_error()));
  else
    printf("apex-train export: %s (gpt: %lld layers, width %lld, %lld heads, vocab %lld, %lld positions) -> %s/model.safetensors, %s/config.json\n",
           step, (long long)o.n_layer, (long long)o.n_embd, (long long)o.n_head, (long long)o.vocab, (long long)o.n_positions, out, out);
  apex_model_destroy(m);
  return rc;
}
