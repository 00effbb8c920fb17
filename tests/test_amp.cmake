# Also on the portable reference path (APEX_CPU_ISA=portable): its matrix product must keep the
# property the two-loss test relies on, C += A B giving the bits of A B added apart.
add_test(NAME test_amp_portable COMMAND test_amp)
set_tests_properties(test_amp_portable PROPERTIES ENVIRONMENT "APEX_TEST_DATA=${CMAKE_CURRENT_SOURCE_DIR}/data;APEX_CPU_ISA=portable" TIMEOUT 600)
