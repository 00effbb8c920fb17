/* tokenizer.h: --tokenizer DIR, turning GPT-2 token ids back into text for the sample. Decoding
 * GPT-2's byte-level BPE needs only the vocabulary, Hugging Face's DIR/vocab.json ({"token": id});
 * the merges are for encoding. Each token's string spells bytes through GPT-2's bytes_to_unicode
 * table (a printable byte is its own character, the 68 others are U+0100 onwards in byte order), so
 * a token decodes to the bytes its characters stand for, and a sample to the concatenation. */
#ifndef APEX_TRAIN_TOKENIZER_H
#define APEX_TRAIN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct tokenizer {
  uint8_t **bytes; /* [n]: token id's bytes (NULL for an id vocab.json skips) */
  size_t *len;     /* [n] */
  int64_t n;       /* largest id + 1 */
  int64_t eot;     /* the id of "<|endoftext|>", or -1 */
} tokenizer;

/* Reads DIR/vocab.json into *t (tokenizer_free frees it). On a missing or unreadable file, bad JSON,
 * an entry whose value is not a whole number in [0, 2^31), two tokens with one id, or a token with a
 * character outside GPT-2's byte table, prints one line to stderr naming the file and what is wrong
 * and returns non-zero with nothing allocated. */
int tokenizer_load(const char *dir, tokenizer *t);
void tokenizer_free(tokenizer *t);
/* The id of "<|endoftext|>" (GPT-2's document separator), or -1 when the vocabulary has none. */
int64_t tokenizer_eot(const tokenizer *t);
/* Writes token id's bytes to f; an id the vocabulary does not have is written as <id N>. */
void tokenizer_write(const tokenizer *t, int64_t id, FILE *f);

#endif
