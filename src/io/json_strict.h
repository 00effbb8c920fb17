/* json_strict.h: the rules of strict JSON (RFC 8259, as serde_json and Python's json apply them) that
 * cJSON does not enforce, checked on the raw text before cJSON parses it. cJSON skips any byte up to
 * 0x20 (NUL included) between tokens, keeps raw control characters inside strings, reads "01" and "1."
 * as numbers, decodes "\u0000" into a string that C then cuts short, ignores what follows the value,
 * and takes any bytes as UTF-8; a reader built on it alone would accept files that the format's
 * reference implementation refuses, or read them differently. Internal to the io layer. */
#ifndef APEX_IO_JSON_STRICT_H
#define APEX_IO_JSON_STRICT_H

#include <stddef.h>

/* Offset of the first byte of s[0, n) that does not start a well-formed UTF-8 sequence (overlong
 * forms, surrogates and code points past U+10FFFF included, as Rust's from_utf8 and Python refuse
 * them), or n when all of it is valid. */
size_t apex__utf8_invalid_at(const char *s, size_t n);

/* What apex__json_strict_check found wrong: the problem in words (NULL when the text passes) and the
 * byte offset in the text where it is. */
typedef struct {
  const char *what;
  size_t at;
} apex__json_flaw;

/* Checks that text[0, len) is valid UTF-8 and, lexically, one JSON value followed by nothing but JSON
 * whitespace (space, tab, CR, LF): no other control byte between tokens, none unescaped inside a
 * string, no "\u0000" escape (a C string cannot hold it), every number in RFC 8259's grammar. The
 * grammar of objects, arrays and literals is left to the parser. *value_end is where the value ends
 * (len when the text never closes it, which the parser then reports). */
apex__json_flaw apex__json_strict_check(const char *text, size_t len, size_t *value_end);

#endif
