# check_layers.cmake: fails when a file includes a header of a layer above its own.
#
# Run as `cmake -DROOT=<source tree> -P check_layers.cmake`. The layer order is read from ROOT's
# CMakeLists.txt (`set(APEX_LAYERS ...)`), so that list stays the one source of truth; a layer may
# include its own headers and those of the layers listed before it, never one listed after it.
#
# What is checked, with the layer each file belongs to:
#   - every .c/.h/.cu/.cuh under src/<layer>/ (any depth): the layer is the folder under src/;
#   - every public header include/apex/*.h: its layer comes from the table below.
# What an include resolves to:
#   - "apex/<name>.h" (quotes or angle brackets): the public header's layer from the table;
#   - "<layer>/...": that layer; "name.h" or "../..." resolves against the including file's folder.
# Anything the check cannot place (a folder under src/ missing from APEX_LAYERS, a public header
# missing from the table, a table entry with no header) is an error too, so the check cannot pass
# by overlooking a file.
#
# _pending lists edges against the order that the backend layer (issue 16) removes as it moves the
# CUDA code under src/backend/: each is printed on every run, and an entry that no longer occurs is
# an error, so the list can only shrink and must be emptied by hand as the edges go.
cmake_minimum_required(VERSION 3.16)

if(NOT DEFINED ROOT)
  message(FATAL_ERROR "check_layers: pass -DROOT=<source tree>")
endif()

# Public header -> layer. apex.h includes every header, so it stands with the last layer.
set(_public_layers
  status.h=core dtype.h=core tensor.h=core rng.h=core threads.h=core version.h=core
  cuda.h=backend
  multi_tensor.h=multi_tensor
  optim.h=optim
  autograd.h=autograd nn_ops.h=autograd
  nn.h=nn
  amp.h=amp amp_config.h=amp loss_scaler.h=amp fp16_optimizer.h=amp
  parallel.h=parallel ddp.h=parallel
  safetensors.h=io model_io.h=io data.h=io
  apex.h=io)

# "<file>|<include>": the CUDA public API and the optimizer/scaler it calls up into, until the
# backend interface replaces them (cuda.h keeps device info, stream and allocator stats; core gets a
# storage that carries the backend that frees it; one loss scaler; multi-tensor types become
# backend argument structs).
set(_pending
  "include/apex/cuda.h|apex/loss_scaler.h" "include/apex/cuda.h|apex/nn_ops.h" "include/apex/cuda.h|apex/optim.h"
  "src/core/tensor.c|apex/cuda.h" "src/core/tensor.c|cuda/cuda_internal.h"
  "src/cuda/api.c|optim/optim_internal.h"
  "src/cuda/cuda_internal.h|apex/loss_scaler.h" "src/cuda/cuda_internal.h|apex/optim.h"
  "src/cuda/loss_scaler.cu|amp/scale_rule.h"
  "src/cuda/mt_apply.cuh|apex/multi_tensor.h")
if(DEFINED PENDING)  # the self-test passes its own list (empty: -DPENDING=)
  set(_pending ${PENDING})
endif()
set(_pending_seen "")

file(READ "${ROOT}/CMakeLists.txt" _cm)
if(NOT _cm MATCHES "set\\(APEX_LAYERS ([^)]*)\\)")
  message(FATAL_ERROR "check_layers: no set(APEX_LAYERS ...) in ${ROOT}/CMakeLists.txt")
endif()
set(_order "${CMAKE_MATCH_1}")
if(DEFINED ORDER)  # the self-test passes a wrong order to see the check fail
  set(_order "${ORDER}")
endif()
string(REGEX REPLACE "[ \t\r\n]+" ";" _layers "${_order}")
list(REMOVE_ITEM _layers "")
# Until src/cuda/ moves to src/backend/cuda/, the cuda folder is the backend layer.
list(FIND _layers backend _has_backend)
list(FIND _layers cuda _has_cuda)
if(_has_backend EQUAL -1 AND NOT _has_cuda EQUAL -1)
  list(TRANSFORM _layers REPLACE "^cuda$" backend)
  set(_alias_cuda ON)
endif()

set(_errors 0)
macro(_fail msg)
  message("${msg}")
  math(EXPR _errors "${_errors} + 1")
endmacro()

# _rank(<layer> <out>): the layer's position in APEX_LAYERS, -1 if absent.
function(_rank layer out)
  if(_alias_cuda AND layer STREQUAL "cuda")
    set(layer backend)
  endif()
  list(FIND _layers "${layer}" _i)
  set(${out} ${_i} PARENT_SCOPE)
endfunction()

function(_public_layer name out)
  set(_l "")
  foreach(_p IN LISTS _public_layers)
    if(_p MATCHES "^([^=]+)=(.+)$" AND CMAKE_MATCH_1 STREQUAL name)
      set(_l ${CMAKE_MATCH_2})
    endif()
  endforeach()
  set(${out} "${_l}" PARENT_SCOPE)
endfunction()

# Every public header is placed, and every table entry names a header.
file(GLOB _pub RELATIVE "${ROOT}/include/apex" "${ROOT}/include/apex/*.h")
foreach(_h IN LISTS _pub)
  _public_layer(${_h} _l)
  if(_l STREQUAL "")
    _fail("include/apex/${_h}: not in check_layers.cmake's table of public headers; add it with its layer")
  endif()
endforeach()
foreach(_p IN LISTS _public_layers)
  string(REGEX REPLACE "=.*" "" _h "${_p}")
  if(NOT EXISTS "${ROOT}/include/apex/${_h}")
    _fail("check_layers.cmake: the table names include/apex/${_h}, which does not exist; drop it")
  endif()
endforeach()

# _check_file(<path relative to ROOT> <layer of the file>)
function(_check_file rel layer)
  _rank(${layer} _own)
  get_filename_component(_dir "${ROOT}/${rel}" DIRECTORY)
  file(STRINGS "${ROOT}/${rel}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
  foreach(_line IN LISTS _lines)
    if(NOT _line MATCHES "#[ \t]*include[ \t]*[\"<]([^\">]+)[\">]")
      continue()
    endif()
    set(_inc "${CMAKE_MATCH_1}")
    set(_to "")
    if(_inc MATCHES "^apex/([^/]+)$")
      _public_layer(${CMAKE_MATCH_1} _to)
      if(_to STREQUAL "")
        set(_errors_here "${_errors_here};${rel}: includes ${_inc}, which is not a known public header")
        continue()
      endif()
    elseif(_line MATCHES "\"")
      # A quoted path: under src/ by its first folder, else relative to the including file.
      string(REGEX MATCH "^[^/]+" _first "${_inc}")
      _rank(${_first} _r)
      if(_inc MATCHES "/" AND NOT _r EQUAL -1 AND EXISTS "${ROOT}/src/${_inc}")
        set(_to ${_first})
      else()
        get_filename_component(_abs "${_inc}" ABSOLUTE BASE_DIR "${_dir}")
        file(RELATIVE_PATH _relinc "${ROOT}/src" "${_abs}")
        if(_relinc MATCHES "^([^/.][^/]*)/")
          set(_to ${CMAKE_MATCH_1})
        endif()
      endif()
    endif()
    if(_to STREQUAL "")
      continue() # a system or third-party header
    endif()
    _rank(${_to} _their)
    if(_their GREATER _own AND "${rel}|${_inc}" IN_LIST _pending)
      message("pending: ${rel} includes \"${_inc}\" (layer ${_to}) from layer ${layer}")
      set(_pending_seen "${_pending_seen};${rel}|${_inc}")
    elseif(_their GREATER _own)
      set(_errors_here "${_errors_here};${rel}: includes \"${_inc}\" (layer ${_to}) from layer ${layer}, and ${_to} stands above ${layer} in APEX_LAYERS (${_layers_str})")
    endif()
  endforeach()
  set(_errors_here "${_errors_here}" PARENT_SCOPE)
  set(_pending_seen "${_pending_seen}" PARENT_SCOPE)
endfunction()

string(REPLACE ";" " " _layers_str "${_layers}")
set(_errors_here "")
set(_nfiles 0)

foreach(_h IN LISTS _pub)
  _public_layer(${_h} _l)
  if(NOT _l STREQUAL "")
    _check_file("include/apex/${_h}" ${_l})
    math(EXPR _nfiles "${_nfiles} + 1")
  endif()
endforeach()

file(GLOB _dirs RELATIVE "${ROOT}/src" "${ROOT}/src/*")
foreach(_d IN LISTS _dirs)
  if(NOT IS_DIRECTORY "${ROOT}/src/${_d}")
    continue()
  endif()
  _rank(${_d} _r)
  if(_r EQUAL -1)
    _fail("src/${_d}/: a folder under src/ that APEX_LAYERS (${_layers_str}) does not list; add it in its place")
    continue()
  endif()
  file(GLOB_RECURSE _files RELATIVE "${ROOT}"
       "${ROOT}/src/${_d}/*.c" "${ROOT}/src/${_d}/*.h" "${ROOT}/src/${_d}/*.cu" "${ROOT}/src/${_d}/*.cuh")
  list(SORT _files)
  foreach(_f IN LISTS _files)
    _check_file("${_f}" ${_d})
    math(EXPR _nfiles "${_nfiles} + 1")
  endforeach()
endforeach()

foreach(_e IN LISTS _errors_here)
  if(NOT _e STREQUAL "")
    _fail("${_e}")
  endif()
endforeach()

foreach(_p IN LISTS _pending)
  if(NOT "${_p}" IN_LIST _pending_seen)
    _fail("check_layers.cmake: pending edge ${_p} no longer occurs; drop it from _pending")
  endif()
endforeach()

if(_errors GREATER 0)
  message(FATAL_ERROR "check_layers: ${_errors} layering error(s) in ${_nfiles} files")
endif()
list(LENGTH _pending _npending)
message("check_layers: ${_nfiles} files, every include within the order ${_layers_str} but the ${_npending} pending edges above")
