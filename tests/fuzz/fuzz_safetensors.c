/* fuzz_safetensors.c: libFuzzer target for the safetensors reader. Any input must either be refused
 * with a message or parse into tensors whose every byte can be read back; never crash, leak or read
 * out of bounds (AddressSanitizer watches). Built and run by tests/fuzz/run.sh. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "apex/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  apex_safetensors *st = apex_safetensors_parse(data, size);
  if (!st) {
    /* A refusal must say why. */
    if (apex_last_error()[0] == '\0') __builtin_trap();
    return 0;
  }
  for (int i = 0; i < apex_safetensors_count(st); i++) {
    apex_tensor *t = apex_safetensors_get(st, apex_safetensors_name(st, i));
    if (t) {
      volatile uint8_t sink = 0;
      const uint8_t *p = apex_tensor_data(t);
      for (size_t k = 0; k < apex_tensor_nbytes(t); k++) sink ^= p[k];
      (void)sink;
      apex_tensor_destroy(t);
    }
  }
  apex_safetensors_metadata(st, "format");
  apex_safetensors_close(st);
  return 0;
}
