# The same PyTorch comparison on the portable reference path (APEX_CPU_ISA=portable: plain-C
# conversions and the reference matrix product), which test_backend_ops holds every fast path to.
add_test(NAME test_nn_golden_portable COMMAND test_nn_golden)
set_tests_properties(test_nn_golden_portable PROPERTIES ENVIRONMENT "APEX_TEST_DATA=${CMAKE_CURRENT_SOURCE_DIR}/data;APEX_CPU_ISA=portable" TIMEOUT 600)
