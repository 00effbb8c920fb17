/* test_version.c: the version's three forms agree: the APEX_VERSION_* macros, APEX_VERSION_STRING,
 * apex_version() (what the linked library says) and the project version CMake read from version.h
 * (passed in by test_version.cmake), so that none of them can drift from the others. */
#include <stdio.h>

#include "apex/version.h"
#include "testutil.h"

static void test_forms_agree(void **state) {
  (void)state;
  char from_macros[32];
  snprintf(from_macros, sizeof from_macros, "%d.%d.%d", APEX_VERSION_MAJOR, APEX_VERSION_MINOR, APEX_VERSION_PATCH);
  assert_string_equal(from_macros, APEX_VERSION_STRING);
  assert_non_null(apex_version());
  assert_string_equal(apex_version(), APEX_VERSION_STRING);
  assert_string_equal(APEX_TEST_PROJECT_VERSION, APEX_VERSION_STRING);
  /* The number, from the library's string parsed back. */
  int major = -1, minor = -1, patch = -1, used = 0;
  assert_int_equal(sscanf(apex_version(), "%d.%d.%d%n", &major, &minor, &patch, &used), 3);
  assert_int_equal((size_t)used, strlen(apex_version())); /* nothing after the patch number */
  assert_int_equal(major, APEX_VERSION_MAJOR);
  assert_int_equal(minor, APEX_VERSION_MINOR);
  assert_int_equal(patch, APEX_VERSION_PATCH);
  /* 10000 * major + 100 * minor + patch orders versions only while minor and patch stay below 100. */
  assert_true(minor >= 0 && minor < 100 && patch >= 0 && patch < 100);
  assert_int_equal(APEX_VERSION_NUMBER, 10000 * major + 100 * minor + patch);
  /* Usable in the preprocessor, as a program guarding a newer call would use it. */
#if APEX_VERSION_NUMBER < 200
#error "APEX_VERSION_NUMBER is not a preprocessor constant of at least 0.2.0"
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_forms_agree)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
