/* tokens.c: reading byte-level text and llm.c token files (tokens.h). */
#include "tokens.h"

#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* Token files beyond 8 GiB are refused rather than doubled into a 16 GiB buffer. */
static const size_t TOKENS_MAX_BYTES = (size_t)1 << 33;

static int ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && strcmp(s + n - m, tail) == 0;
}

int tokens_load(const char *path, token_data *out) {
  memset(out, 0, sizeof *out);
  size_t n;
  uint8_t *buf = file_read_all(path, &n, TOKENS_MAX_BYTES);
  if (!buf) {
    fprintf(stderr, "apex-train: cannot read the data %s: %s\n", path, strerror(errno));
    return 1;
  }
  int bin = ends_with(path, ".bin") || (n >= 4 && le32(buf) == TOKENS_BIN_MAGIC);
  const char *bad = NULL;
  char why[160];
  if (n == 0) {
    bad = "the file is empty";
  } else if (!bin) {
    out->tok = malloc(n * sizeof *out->tok);
    if (!out->tok) bad = "out of memory";
    for (size_t i = 0; out->tok && i < n; i++) out->tok[i] = buf[i];
    out->len = n;
    out->vocab = 256;
    out->bytes = 1;
  } else if (n < 1024) {
    snprintf(why, sizeof why, "%zu bytes, shorter than the 1024-byte header of an llm.c token file (truncated?)", n);
    bad = why;
  } else if (le32(buf) != TOKENS_BIN_MAGIC) {
    snprintf(why, sizeof why, "magic %u, not llm.c's %d (not an llm.c token file)", le32(buf), TOKENS_BIN_MAGIC);
    bad = why;
  } else if (le32(buf + 4) != 1) {
    snprintf(why, sizeof why, "version %u; apex-train reads version 1 (uint16 GPT-2 tokens)", le32(buf + 4));
    bad = why;
  } else {
    uint64_t count = le32(buf + 8), have = (n - 1024) / 2;
    if (count == 0) {
      bad = "its header counts 0 tokens (empty)";
    } else if ((n - 1024) % 2 || count != have) {
      snprintf(why, sizeof why, "its header counts %llu tokens, the file holds %llu%s (truncated or mismatched)",
               (unsigned long long)count, (unsigned long long)have, (n - 1024) % 2 ? " and a half" : "");
      bad = why;
    } else if (!(out->tok = malloc(count * sizeof *out->tok))) {
      bad = "out of memory";
    } else {
      uint16_t mx = 0;
      for (uint64_t i = 0; i < count; i++) {
        out->tok[i] = (uint16_t)(buf[1024 + 2 * i] | buf[1024 + 2 * i + 1] << 8);
        if (out->tok[i] > mx) mx = out->tok[i];
      }
      out->len = count;
      out->vocab = mx < TOKENS_GPT2_VOCAB ? TOKENS_GPT2_VOCAB : (int64_t)mx + 1;
    }
  }
  free(buf);
  if (bad) {
    fprintf(stderr, "apex-train: --data %s: %s\n", path, bad);
    free(out->tok);
    memset(out, 0, sizeof *out);
    return 1;
  }
  return 0;
}
