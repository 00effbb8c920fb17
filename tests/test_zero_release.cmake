# test_zero_release under mpirun with 1 to 4 ranks (the plain run covers the local group), each bounded
# so that a hang fails the test instead of the ctest run.
set_tests_properties(test_zero_release PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_WAIT_POLICY=passive")
if(APEX_MPI)
  foreach(np 1 2 3 4)
    add_test(NAME test_zero_release_np${np} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpirun_test.sh ${np} $<TARGET_FILE:test_zero_release>)
    set_tests_properties(test_zero_release_np${np} PROPERTIES TIMEOUT 300 PROCESSORS ${np} SKIP_RETURN_CODE 77
                         ENVIRONMENT "OMP_WAIT_POLICY=passive;OMP_NUM_THREADS=1")
  endforeach()
endif()
