/* tokens.h: the GPT's training text as tokens. Two formats:
 *
 *   any file:   byte-level, one token per byte, vocabulary 256;
 *   llm.c .bin: a file named *.bin, or any file that starts with the magic: a header of 256 int32
 *               (little-endian: magic 20240520, version 1, token count, the rest unused), then
 *               `count` uint16 tokens (GPT-2's tokenizer in llm.c's data scripts).
 *
 * The vocabulary of a .bin file is GPT-2's, 50257, when every token is below it (the usual case: a
 * file of GPT-2 tokens, whichever of them it happens to use), otherwise max token + 1. */
#ifndef APEX_TRAIN_TOKENS_H
#define APEX_TRAIN_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#define TOKENS_BIN_MAGIC 20240520
#define TOKENS_GPT2_VOCAB 50257

typedef struct token_data {
  uint16_t *tok;
  size_t len;
  int64_t vocab;
  int bytes;      /* 1: byte-level text (tokens are bytes, printable as text) */
} token_data;

/* Reads path in either format into *out (freed with free(out->tok)). On a missing, unreadable,
 * empty, truncated or inconsistent file prints one line to stderr naming the file and what is wrong,
 * and returns non-zero with nothing allocated. */
int tokens_load(const char *path, token_data *out);

#endif
