/* consumer.c: the smallest program that uses an installed apex: converts a value and runs one
 * loss-scaler step. Exits 0 when both give the documented answers. */
#include <apex/apex.h>
#include <stdio.h>

int main(void) {
  if (apex_f32_to_f16(1.0f) != 0x3C00) return 1;
  apex_loss_scaler *s = apex_loss_scaler_create(NULL);
  int skip = 0;
  if (!s || apex_loss_scaler_update(s, 1, &skip) != APEX_OK || !skip) return 2;
  printf("scale after one overflow: %g\n", apex_loss_scaler_scale(s));
  int ok = apex_loss_scaler_scale(s) == 32768.0f;
  apex_loss_scaler_destroy(s);
  return ok ? 0 : 3;
}
