/* test_cuda.c: what is the CUDA backend's alone: the device's name, tensors in its memory, the caching
 * allocator and its statistics, and the stream and event slots (backend/streams.h) that the NCCL process
 * group runs its collectives with. The CUDA kernels' results against the CPU are parity cases of
 * test_backend_ops (backend_parity_cases.h). Without a GPU the program prints why and exits 77, which
 * ctest reports as skipped. */
#include <stdio.h>

#include "apex/cuda.h"
#include "backend/backend.h"
#include "testutil.h"

static void test_tensor_ops_and_allocator(void **state) {
  (void)state;
  int64_t shape[2] = {3, 1000};
  apex_tensor *d = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_BF16, 2, shape);
  assert_non_null(d);
  assert_int_equal(apex_tensor_device(d), APEX_DEVICE_CUDA);
  assert_true(apex_tensor_get(d, 2999) == 0.0f); /* zero-filled */
  TU_OK(apex_tensor_fill(d, 1.0f / 3.0f));
  assert_true(apex_tensor_get(d, 1234) == apex_bf16_to_f32(apex_f32_to_bf16(1.0f / 3.0f)));
  apex_tensor_set(d, 7, -2.5f);
  assert_true(apex_tensor_get(d, 7) == -2.5f);
  apex_tensor *c = apex_tensor_clone(d);
  assert_int_equal(apex_tensor_device(c), APEX_DEVICE_CUDA);
  assert_true(apex_tensor_get(c, 7) == -2.5f);
  apex_tensor_destroy(c);
  apex_tensor_destroy(d);
  /* A loop of the same sizes reuses cached blocks: no new cudaMalloc after the first round. */
  apex_cuda_memory_stats s0, s1;
  for (int round = 0; round < 3; round++) {
    if (round == 1) TU_OK(apex_cuda_memory_stats_get(&s0));
    apex_tensor *t[8];
    for (int i = 0; i < 8; i++) {
      int64_t n = 1000 + 4096 * i;
      t[i] = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &n);
      assert_non_null(t[i]);
    }
    for (int i = 0; i < 8; i++) apex_tensor_destroy(t[i]);
  }
  TU_OK(apex_cuda_memory_stats_get(&s1));
  assert_int_equal(s0.device_allocs, s1.device_allocs);
  assert_true(s1.peak_allocated >= s1.allocated);
  char name[128];
  TU_OK(apex_cuda_device_name(name, sizeof name));
  print_message("device: %s\n", name);
}

/* The stream and event slots: a side stream ordered after apex's stream through an event (the NCCL
 * group's pattern), the events' queries, and a copy on apex's stream that the side stream waits for. */
static void test_streams_and_events(void **state) {
  (void)state;
  const apex_backend *b = apex__backend_named("cuda", "test_streams_and_events");
  assert_non_null(b);
  const apex_streams *s = b->streams;
  assert_non_null(s);
  const char *why = NULL;
  assert_true(s->device_count(&why) >= 1);
  TU_OK(s->enter("test"));
  void *side = NULL, *ready = NULL, *done = NULL;
  TU_OK(s->stream_create("side stream", &side));
  TU_OK(s->event_create("ready", &ready));
  TU_OK(s->event_create("done", &done));
  assert_non_null(side);
  /* work on apex's stream (a fill of 64 MiB), then the side stream waits for it and marks its own end */
  int64_t n = 1 << 24;
  apex_tensor *t = apex_tensor_create_on(APEX_DEVICE_CUDA, APEX_F32, 1, &n);
  assert_non_null(t);
  TU_OK(apex_tensor_fill(t, 1.5f));
  TU_OK(s->event_record("ready", ready, NULL));
  TU_OK(s->stream_wait("wait", side, ready));
  TU_OK(s->event_record("done", done, side));
  /* done follows ready: once done reports finished, so must ready, and the fill is visible */
  int fin = 0;
  for (long spins = 0; !fin; spins++) {
    TU_OK(s->event_query("done", done, &fin));
    assert_true(spins < 100000000L);
  }
  int fin_ready = 0;
  TU_OK(s->event_query("ready", ready, &fin_ready));
  assert_int_equal(fin_ready, 1);
  assert_true(apex_tensor_get(t, n - 1) == 1.5f);
  /* a fresh event that was never recorded counts as finished (CUDA's rule), and NULLs are fine to destroy */
  void *fresh = NULL;
  TU_OK(s->event_create("fresh", &fresh));
  TU_OK(s->event_query("fresh", fresh, &fin));
  assert_int_equal(fin, 1);
  s->event_destroy(fresh);
  s->event_destroy(NULL);
  s->stream_destroy(NULL);
  s->event_destroy(done);
  s->event_destroy(ready);
  s->stream_destroy(side);
  apex_tensor_destroy(t);
  /* the CPU backend has no asynchronous work, so no stream slots */
  assert_null(apex__backend_for(APEX_DEVICE_CPU)->streams);
}

int main(void) {
  const char *why;
  if (!apex_cuda_available(&why)) {
    printf("test_cuda skipped: %s\n", why);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tensor_ops_and_allocator),
      cmocka_unit_test(test_streams_and_events),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
