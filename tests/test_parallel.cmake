# test_parallel under mpirun with 2 and 3 ranks (the plain run covers the local backend and skips the
# MPI cases). Each is bounded: a collective that hangs fails the test instead of the whole ctest run.
set_tests_properties(test_parallel PROPERTIES TIMEOUT 120)
if(APEX_MPI)
  foreach(np 2 3)
    add_test(NAME test_parallel_np${np} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpirun_test.sh ${np} $<TARGET_FILE:test_parallel>)
    set_tests_properties(test_parallel_np${np} PROPERTIES TIMEOUT 180 PROCESSORS ${np} SKIP_RETURN_CODE 77)
  endforeach()
endif()
