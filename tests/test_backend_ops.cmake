# The GPT-2 parity cases (backend_parity_gpt2.h) run the model of bench/gpt2_cuda.c (not part of the
# library) against apex's CPU autograd.
target_sources(test_backend_ops PRIVATE ${PROJECT_SOURCE_DIR}/bench/gpt2_cuda.c)
target_include_directories(test_backend_ops PRIVATE ${PROJECT_SOURCE_DIR}/bench)
# bench/gpt2_cuda.c calls the fused attention by name (cuda_internal.h) in a CUDA build.
if(APEX_CUDA)
  target_compile_definitions(test_backend_ops PRIVATE APEX_GPT2_CUDA_INTERNAL=1)
endif()
