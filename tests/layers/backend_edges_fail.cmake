# backend_edges_fail.cmake: shows that check_layers refuses the four upward includes the backend layer
# once had (issue 16): its optimizer and scaler headers including optim.h / loss_scaler.h, which belong
# to the optim layer above it. check_layers has no exception list, so each must be an error.
#
# Run as `cmake -DROOT=<source tree> -DWORK=<scratch folder> -P backend_edges_fail.cmake`. It copies the
# tree's CMakeLists.txt, include/ and src/ into WORK, adds to each of the four headers the include it
# used to have, runs check_layers.cmake on the copy, and fails unless that run fails naming all four.
cmake_minimum_required(VERSION 3.16)

if(NOT DEFINED ROOT OR NOT DEFINED WORK)
  message(FATAL_ERROR "backend_edges_fail: pass -DROOT=<source tree> -DWORK=<scratch folder>")
endif()

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
file(COPY "${ROOT}/CMakeLists.txt" DESTINATION "${WORK}")
file(COPY "${ROOT}/include" "${ROOT}/src" DESTINATION "${WORK}")

set(_edges
  "src/backend/args_optim.h|apex/optim.h"
  "src/backend/cpu/cpu_optim.h|apex/optim.h"
  "src/backend/cuda/cuda_internal.h|apex/loss_scaler.h"
  "src/backend/scale_rule.h|apex/loss_scaler.h")
foreach(_e IN LISTS _edges)
  string(REGEX REPLACE "\\|.*" "" _file "${_e}")
  string(REGEX REPLACE ".*\\|" "" _inc "${_e}")
  if(NOT EXISTS "${WORK}/${_file}")
    message(FATAL_ERROR "backend_edges_fail: ${_file} is gone from the tree, update this test's list")
  endif()
  file(APPEND "${WORK}/${_file}" "\n#include \"${_inc}\"\n")
endforeach()

execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${WORK} -P ${CMAKE_CURRENT_LIST_DIR}/check_layers.cmake
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
set(_all "${_out}${_err}")
if(_rc EQUAL 0)
  message(FATAL_ERROR "backend_edges_fail: check_layers passed a tree with four upward includes:\n${_all}")
endif()
foreach(_e IN LISTS _edges)
  string(REGEX REPLACE "\\|.*" "" _file "${_e}")
  string(REGEX REPLACE ".*\\|" "" _inc "${_e}")
  string(FIND "${_all}" "${_file}: includes \"${_inc}\" (layer optim) from layer backend" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "backend_edges_fail: check_layers did not name ${_file} including ${_inc}:\n${_all}")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")
message("backend_edges_fail: check_layers refused each of the four upward includes")
