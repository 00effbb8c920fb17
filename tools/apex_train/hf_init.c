/* hf_init.c: --init-from a Hugging Face GPT-2 (hf_init.h). */
#include "hf_init.h"

#include <stdio.h>
#include <string.h>

#include "report.h" /* one_line */

int hf_is_file(const char *path) {
  if (!path) return 0;
  apex_safetensors *st = apex_safetensors_open(path);
  int hf = st && apex_safetensors_has(st, "transformer.wte.weight");
  apex_safetensors_close(st);
  apex_clear_error();
  return hf;
}

/* Flag `name` (value v), when given, must be the file's value. */
static int agrees(const train_args *a, const char *name, long v, long file, const char *path) {
  if (!args_given(a, name) || v == file) return 0;
  fprintf(stderr, "apex-train: --%s %ld: --init-from %s holds a GPT-2 with %s %ld (sizes come from the file); drop --%s or give %ld\n", name, v, path,
          name, file, name, file);
  return 2;
}

int hf_init_dims(const train_args *a, model_kind kind, const char *data, dataset *d, model_dims *dims, int *is_hf) {
  const char *path = a->init_from;
  *is_hf = 0;
  apex_safetensors *st = apex_safetensors_open(path);
  if (!st) {
    fprintf(stderr, "apex-train: --init-from %s: %s\n", path, one_line(apex_last_error()));
    return 1;
  }
  int hf = apex_safetensors_has(st, "transformer.wte.weight"), apex_layout = apex_safetensors_has(st, "wte.weight");
  apex_safetensors_close(st);
  if (kind != MODEL_GPT) {
    if (!hf) return 0; /* apex's own layout: the load checks every name */
    fprintf(stderr, "apex-train: --init-from %s is a Hugging Face GPT-2; it initialises --model gpt, not --model %s\n", path, model_kind_name(kind));
    return 2;
  }
  if (!hf && apex_layout) return 0;
  if (!hf) {
    fprintf(stderr, "apex-train: --init-from %s: neither apex-train's GPT layout (wte.weight, h0.ln1.weight, ...) nor Hugging Face's "
                    "GPT-2 (transformer.wte.weight, transformer.h.0.ln_1.weight, ...)\n", path);
    return 2;
  }
  apex_gpt_options o;
  if (apex_gpt_hf_sizes(path, &o) != APEX_OK) {
    fprintf(stderr, "apex-train: --init-from %s: %s\n", path, one_line(apex_last_error()));
    return 1;
  }
  int rc = agrees(a, "n-layer", a->n_layer, (long)o.n_layer, path);
  if (!rc) rc = agrees(a, "n-embd", a->n_embd, (long)o.n_embd, path);
  if (!rc) rc = agrees(a, "vocab", a->vocab, (long)o.vocab, path);
  if (rc) return rc;
  long head = a->n_head;
  if (!args_given(a, "n-head")) {
    if (o.n_embd % 64) {
      fprintf(stderr, "apex-train: --init-from %s: a GPT-2 of width %lld; its head count is not in the weights: give --n-head\n", path, (long long)o.n_embd);
      return 2;
    }
    head = (long)(o.n_embd / 64); /* GPT-2's heads are 64 wide: 12 for 768, 16 for 1024, 20 for 1280, 25 for 1600 */
  }
  if (o.n_embd % head) {
    fprintf(stderr, "apex-train: --n-head %ld does not divide the width %lld of --init-from %s\n", head, (long long)o.n_embd, path);
    return 2;
  }
  if (a->seq_len > o.n_positions) {
    fprintf(stderr, "apex-train: --seq-len %ld: --init-from %s has %lld positions; give at most %lld\n", a->seq_len, path, (long long)o.n_positions,
            (long long)o.n_positions);
    return 2;
  }
  uint16_t mx = 0;
  for (size_t i = 0; i < d->len + d->val_len; i++)
    if (d->tok[i] > mx) mx = d->tok[i];
  if (mx >= o.vocab) {
    fprintf(stderr, "apex-train: --init-from %s has a vocabulary of %lld tokens, but %s has token %u\n", path, (long long)o.vocab, data, (unsigned)mx);
    return 2;
  }
  d->vocab = o.vocab;
  dims->vocab = o.vocab;
  dims->n_layer = o.n_layer;
  dims->n_embd = o.n_embd;
  dims->n_head = head;
  *is_hf = 1;
  return 0;
}

int hf_init_load(const train_args *a, train_model *tm, apex_amp *amp) {
  if (apex_gpt_load_hf(tm->m, tm->net, amp, a->init_from) == APEX_OK) return 0;
  fprintf(stderr, "apex-train: --init-from %s: %s\n", a->init_from, one_line(apex_last_error()));
  return 1;
}
