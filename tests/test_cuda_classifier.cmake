# The fused classifier's cases call the CUDA backend's kernels by name (cuda_internal.h), which exist only
# in a CUDA build; without one the program says so and exits 77 (skipped).
if(APEX_CUDA)
  target_compile_definitions(test_cuda_classifier PRIVATE APEX_TEST_CUDA=1)
else()
  target_compile_definitions(test_cuda_classifier PRIVATE APEX_TEST_CUDA=0)
endif()
set_tests_properties(test_cuda_classifier PROPERTIES SKIP_RETURN_CODE 77)
