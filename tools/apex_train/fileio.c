/* fileio.c: reading a whole file into memory (fileio.h). */
#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

uint8_t *file_read_all(const char *path, size_t *len, size_t max_bytes) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  while (buf) {
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0) break;
    if (n == cap) {
      uint8_t *nb = max_bytes && cap >= max_bytes ? NULL : realloc(buf, cap *= 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        errno = ENOMEM;
      } else {
        buf = nb;
      }
    }
  }
  if (buf && ferror(f)) {
    free(buf);
    buf = NULL;
    errno = EISDIR;
  }
  fclose(f);
  *len = n;
  return buf;
}
