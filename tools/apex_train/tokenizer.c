/* tokenizer.c: GPT-2 byte-level BPE decoding from Hugging Face's vocab.json (tokenizer.h). */
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"

/* GPT-2's bytes_to_unicode, inverted: the byte a code point stands for, or -1. */
static int byte_of(uint32_t cp) {
  static int table[324];
  static int made;
  if (!made) {
    for (int i = 0; i < 324; i++) table[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
      int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      table[printable ? b : 256 + extra++] = b;
    }
    made = 1;
  }
  return cp < 324 ? table[cp] : -1;
}

/* The next code point of UTF-8 s (advanced past it), or UINT32_MAX for a malformed sequence. */
static uint32_t next_cp(const unsigned char **s) {
  const unsigned char *p = *s;
  uint32_t c = p[0];
  int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
  if (n < 0) return UINT32_MAX;
  if (n) c &= 0x3Fu >> n;
  for (int i = 1; i <= n; i++) {
    if ((p[i] & 0xC0) != 0x80) return UINT32_MAX;
    c = c << 6 | (p[i] & 0x3Fu);
  }
  *s = p + n + 1;
  return c;
}

void tokenizer_free(tokenizer *t) {
  for (int64_t i = 0; t->bytes && i < t->n; i++) free(t->bytes[i]);
  free(t->bytes);
  free(t->len);
  memset(t, 0, sizeof *t);
}

int tokenizer_load(const char *dir, tokenizer *t) {
  memset(t, 0, sizeof *t);
  t->eot = -1;
  char path[4200];
  snprintf(path, sizeof path, "%s/vocab.json", dir);
  size_t size;
  uint8_t *text = file_read_all(path, &size, (size_t)256 << 20);
  if (!text) {
    fprintf(stderr, "apex-train: --tokenizer: cannot read %s: %s (give the directory of a Hugging Face GPT-2 tokenizer, holding vocab.json)\n", path,
            strerror(errno));
    return 2;
  }
  cJSON *root = cJSON_ParseWithLength((const char *)text, size);
  free(text);
  const char *bad = NULL;
  char why[512] = "";
  if (!cJSON_IsObject(root)) bad = root ? "it is not a JSON object of token: id" : "it is not valid JSON";
  for (const cJSON *e = root && !bad ? root->child : NULL; e && !bad; e = e->next) {
    if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= 2147483648.0 || e->valuedouble != (double)(int64_t)e->valuedouble) {
      snprintf(why, sizeof why, "token \"%.64s\" has no whole-number id in [0, 2^31)", e->string);
      bad = why;
    } else if ((int64_t)e->valuedouble >= t->n) {
      t->n = (int64_t)e->valuedouble + 1;
    }
  }
  if (!bad && t->n == 0) bad = "it holds no tokens";
  if (!bad) {
    t->bytes = calloc((size_t)t->n, sizeof *t->bytes);
    t->len = calloc((size_t)t->n, sizeof *t->len);
    if (!t->bytes || !t->len) bad = "out of memory";
  }
  for (const cJSON *e = !bad ? root->child : NULL; e && !bad; e = e->next) {
    int64_t id = (int64_t)e->valuedouble;
    if (t->bytes[id]) {
      snprintf(why, sizeof why, "tokens \"%.64s\" and another share id %lld", e->string, (long long)id);
      bad = why;
      break;
    }
    size_t n = strlen(e->string);
    uint8_t *b = malloc(n + 1); /* never longer than its UTF-8 spelling */
    if (!b) {
      bad = "out of memory";
      break;
    }
    t->bytes[id] = b;
    size_t k = 0;
    for (const unsigned char *s = (const unsigned char *)e->string; *s;) {
      uint32_t cp = next_cp(&s);
      int byte = cp == UINT32_MAX ? -1 : byte_of(cp);
      if (byte < 0) {
        snprintf(why, sizeof why, "token \"%.64s\" (id %lld) has a character outside GPT-2's byte table (is this a byte-level BPE vocabulary?)",
                 e->string, (long long)id);
        bad = why;
        break;
      }
      b[k++] = (uint8_t)byte;
    }
    t->len[id] = k;
    if (strcmp(e->string, "<|endoftext|>") == 0) t->eot = id;
  }
  cJSON_Delete(root);
  if (bad) {
    fprintf(stderr, "apex-train: --tokenizer: %s: %s\n", path, bad);
    tokenizer_free(t);
    return 2;
  }
  return 0;
}

int64_t tokenizer_eot(const tokenizer *t) { return t->eot; }

void tokenizer_write(const tokenizer *t, int64_t id, FILE *f) {
  if (id >= 0 && id < t->n && t->bytes[id]) fwrite(t->bytes[id], 1, t->len[id], f);
  else fprintf(f, "<id %lld>", (long long)id);
}
