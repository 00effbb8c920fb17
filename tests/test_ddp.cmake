# test_ddp under mpirun with 2 and 3 ranks (the plain run covers the local backend and skips the
# MPI-only cases), each bounded so that a hang fails the test instead of the ctest run.
set_tests_properties(test_ddp PROPERTIES TIMEOUT 120)
if(APEX_MPI)
  foreach(np 2 3)
    add_test(NAME test_ddp_np${np} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpirun_test.sh ${np} $<TARGET_FILE:test_ddp>)
    set_tests_properties(test_ddp_np${np} PROPERTIES TIMEOUT 180 PROCESSORS ${np} SKIP_RETURN_CODE 77)
  endforeach()
endif()
