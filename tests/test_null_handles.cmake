# test_null_handles reads the public headers to check that its list of calls covers every function taking a handle.
target_compile_definitions(test_null_handles PRIVATE APEX_TEST_INCLUDE_DIR="${PROJECT_SOURCE_DIR}/include/apex")
