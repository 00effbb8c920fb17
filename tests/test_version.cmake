# test_version compares the headers' version with the project version CMake read from version.h.
target_compile_definitions(test_version PRIVATE APEX_TEST_PROJECT_VERSION="${PROJECT_VERSION}")
