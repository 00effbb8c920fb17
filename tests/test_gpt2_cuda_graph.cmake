# The captured GPT-2 step runs the model of bench/gpt2_cuda.c (not part of the library), which calls the CUDA
# backend's internal entry points (the device-id embedding, the graph capture) in a CUDA build. Without a
# GPU (or without CUDA) the program checks its arguments, says why the rest is skipped and exits 77.
target_sources(test_gpt2_cuda_graph PRIVATE ${PROJECT_SOURCE_DIR}/bench/gpt2_cuda.c)
target_include_directories(test_gpt2_cuda_graph PRIVATE ${PROJECT_SOURCE_DIR}/bench)
if(APEX_CUDA)
  target_compile_definitions(test_gpt2_cuda_graph PRIVATE APEX_GPT2_CUDA_INTERNAL=1)
endif()
set_tests_properties(test_gpt2_cuda_graph PROPERTIES SKIP_RETURN_CODE 77)
