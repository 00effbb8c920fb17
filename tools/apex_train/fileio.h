/* fileio.h: reading a whole file into memory, shared by the data loader and the checkpoint reader. */
#ifndef APEX_TRAIN_FILEIO_H
#define APEX_TRAIN_FILEIO_H

#include <stddef.h>
#include <stdint.h>

/* The whole file at path in a new buffer (free() it), its size in *len.
   max_bytes > 0 refuses files larger than that (ENOMEM) instead of growing the buffer further;
   0 means no limit. NULL with errno set on failure: fopen's errno, ENOMEM, or EISDIR when
   path is a directory (fopen succeeds on one; reading it fails). */
uint8_t *file_read_all(const char *path, size_t *len, size_t max_bytes);

#endif
