set_tests_properties(test_cuda PROPERTIES SKIP_RETURN_CODE 77)
# The GPT-2 parity case runs the model of bench/gpt2_cuda.c (not part of the library) against apex's CPU autograd.
target_sources(test_cuda PRIVATE ${PROJECT_SOURCE_DIR}/bench/gpt2_cuda.c)
target_include_directories(test_cuda PRIVATE ${PROJECT_SOURCE_DIR}/bench)
