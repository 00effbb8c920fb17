/* json_strict.c: the strict-JSON checks cJSON leaves out (why: json_strict.h). One pass over the text
 * for UTF-8, one for tokens; both linear in the text's length. */
#include "io/json_strict.h"

#include <stdint.h>
#include <string.h>

/* Length of the well-formed UTF-8 sequence at s[0, n), or 0 if it is not one. */
static size_t utf8_sequence(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
  if (c >= 0xc2 && c <= 0xdf) len = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else return 0;
  if (n < len || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < len; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  return len;
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* Length of the RFC 8259 number at s[0, n): -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, not run
 * on into more number characters (which would make "01" or "1.5.5"); 0 if there is none. */
static size_t number_length(const unsigned char *s, size_t n) {
  size_t i = 0;
  if (i < n && s[i] == '-') i++;
  if (i < n && s[i] == '0') i++;
  else if (i < n && is_digit(s[i]))
    while (i < n && is_digit(s[i])) i++;
  else return 0;
  if (i < n && s[i] == '.') {
    size_t start = ++i;
    while (i < n && is_digit(s[i])) i++;
    if (i == start) return 0;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    size_t start = i;
    while (i < n && is_digit(s[i])) i++;
    if (i == start) return 0;
  }
  if (i < n && (is_digit(s[i]) || s[i] == '.' || s[i] == 'e' || s[i] == 'E' || s[i] == '+' || s[i] == '-')) return 0;
  return i;
}

static apex__json_flaw flaw(const char *what, size_t at) {
  apex__json_flaw f = {what, at};
  return f;
}

size_t apex__utf8_invalid_at(const char *text, size_t n) {
  const unsigned char *s = (const unsigned char *)text;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_sequence(s + i, n - i);
    if (!k) return i;
    i += k;
  }
  return n;
}

apex__json_flaw apex__json_strict_check(const char *text, size_t len, size_t *value_end) {
  const unsigned char *s = (const unsigned char *)text;
  *value_end = len;
  size_t bad = apex__utf8_invalid_at(text, len);
  if (bad < len) return flaw("holds a byte sequence that is not valid UTF-8", bad);
  long depth = 0;
  size_t i = 0;
  while (i < len) {
    unsigned char c = s[i];
    int value_done = 0;
    if (is_ws(c)) {
      i++;
      continue;
    }
    if (c < 0x20) return flaw("holds a control byte between JSON tokens (JSON allows only space, tab, CR and LF there)", i);
    if (c == '"') {
      for (i++; i < len && s[i] != '"'; i++) {
        if (s[i] < 0x20) return flaw("holds an unescaped control byte inside a string", i);
        if (s[i] == '\\') {
          if (len - i >= 6 && memcmp(s + i + 1, "u0000", 5) == 0)
            return flaw("holds \\u0000 (NUL) inside a string, which a C string cannot hold", i);
          i++; /* the escaped character; cJSON checks that the escape is a valid one */
        }
      }
      if (i >= len) return flaw("ends inside a string", len);
      i++;
      value_done = depth == 0;
    } else if (c == '-' || is_digit(c)) {
      size_t k = number_length(s + i, len - i);
      if (!k) return flaw("holds a malformed number (JSON numbers have no leading zeros, '+' or bare '.')", i);
      i += k;
      value_done = depth == 0;
    } else if (c == '{' || c == '[') {
      depth++;
      i++;
    } else if (c == '}' || c == ']') {
      depth--;
      i++;
      value_done = depth <= 0;
    } else {
      /* Literals and punctuation; the parser checks them. A literal is a run of letters. */
      if (c >= 'a' && c <= 'z') {
        while (i < len && s[i] >= 'a' && s[i] <= 'z') i++;
        value_done = depth == 0;
      } else i++;
    }
    if (value_done) {
      *value_end = i;
      for (; i < len; i++)
        if (!is_ws(s[i])) return flaw("continues after the JSON value with something other than whitespace", i);
      break;
    }
  }
  return flaw(NULL, 0);
}
