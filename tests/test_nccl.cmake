# test_nccl: exit 77 (skipped) without the NCCL group or a GPU. Run alone (one rank on GPU 0) and,
# with MPI, under mpirun -np 2 (skipped, on every rank, where a host has fewer GPUs than ranks).
# Even alone it initialises MPI (the group's bootstrap), whose initialisation leaks by design: no
# leak check under the sanitizers, as for the mpirun tests (mpirun_test.sh).
set_tests_properties(test_nccl PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
                     ENVIRONMENT "APEX_TEST_DATA=${CMAKE_CURRENT_SOURCE_DIR}/data;ASAN_OPTIONS=detect_leaks=0")
if(APEX_MPI)
  add_test(NAME test_nccl_np2 COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/mpirun_test.sh 2 $<TARGET_FILE:test_nccl>)
  set_tests_properties(test_nccl_np2 PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 PROCESSORS 2)
endif()
