# check_layers.cmake: fails when a file reaches into a layer above its own.
#
# Run as `cmake -DROOT=<source tree> [-DOBJECTS=<a|b|...> -DNM=<nm>] -P check_layers.cmake`. The
# layer order is read from ROOT's CMakeLists.txt (`set(APEX_LAYERS ...)`), so that list stays the one
# source of truth: a layer may use its own layer and the layers listed before it, never one after it.
# -DREVERSE=ON checks against the reversed order (the self-test).
#
# Two kinds of edge are checked:
#   - includes, in every .c/.h/.cu/.cuh under src/<layer>/ (any depth; the layer is the folder under
#     src/) and in every public header include/apex/*.h (its layer comes from the table below).
#     "apex/<name>.h" is the public header's layer, "<layer>/..." that layer, and "name.h" or "../..."
#     resolves against the including file's folder;
#   - symbols, when OBJECTS lists the library's object files (built from src/<layer>/...): an object
#     that needs a symbol defined by an object of a higher layer. This catches an edge no include
#     shows, such as a function declared by a macro in the lower layer and defined in the higher one.
# Anything the check cannot place (a folder under src/ missing from APEX_LAYERS, a public header
# missing from the table, a table entry with no header) is an error too, so the check cannot pass by
# overlooking a file.
cmake_minimum_required(VERSION 3.16)

if(NOT DEFINED ROOT)
  message(FATAL_ERROR "check_layers: pass -DROOT=<source tree>")
endif()

# Public header -> layer. apex.h includes every header, so it stands with the last layer.
set(_public_layers
  status.h=core dtype.h=core tensor.h=core rng.h=core threads.h=core cpu.h=core version.h=core
  cuda.h=backend kernels.h=backend mt_apply.h=backend index.h=backend
  multi_tensor.h=multi_tensor
  optim_options.h=backend loss_scaler_config.h=backend
  optim.h=optim loss_scaler.h=optim
  autograd.h=autograd nn_ops.h=autograd
  nn.h=nn models.h=nn
  amp.h=amp amp_config.h=amp fp16_optimizer.h=amp capture.h=amp
  parallel.h=parallel ddp.h=parallel zero.h=parallel
  safetensors.h=io model_io.h=io data.h=io gpt_hf.h=io
  apex.h=io)

file(READ "${ROOT}/CMakeLists.txt" _cm)
if(NOT _cm MATCHES "set\\(APEX_LAYERS ([^)]*)\\)")
  message(FATAL_ERROR "check_layers: no set(APEX_LAYERS ...) in ${ROOT}/CMakeLists.txt")
endif()
string(REGEX REPLACE "[ \t\r\n]+" ";" _layers "${CMAKE_MATCH_1}")
list(REMOVE_ITEM _layers "")
if(REVERSE) # the self-test turns the order upside down to see the check fail
  list(REVERSE _layers)
endif()
# Until src/cuda/ moves to src/backend/cuda/, the cuda folder is the backend layer.
list(FIND _layers backend _has_backend)
list(FIND _layers cuda _has_cuda)
if(_has_backend EQUAL -1 AND NOT _has_cuda EQUAL -1)
  list(TRANSFORM _layers REPLACE "^cuda$" backend)
  set(_alias_cuda ON)
endif()
string(REPLACE ";" " " _layers_str "${_layers}")

set(_errors "")

# _layer_of(<folder under src/ or layer name> <out>): the layer it stands for.
function(_layer_of name out)
  if(_alias_cuda AND name STREQUAL "cuda")
    set(name backend)
  endif()
  set(${out} ${name} PARENT_SCOPE)
endfunction()

function(_rank layer out)
  _layer_of(${layer} layer)
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

# _edge(<file> <its layer> <layer used> <what>): records a use of `to` by `rel` when it goes upward.
# Messages avoid ';', which would split them as CMake list items.
macro(_edge rel from to what)
  _rank(${from} _own)
  _rank(${to} _their)
  _layer_of(${to} _to_l)
  if(_their GREATER _own)
    list(APPEND _errors "${rel}: ${what} (layer ${_to_l}) from layer ${from}, and ${_to_l} stands above ${from} in APEX_LAYERS (${_layers_str})")
  endif()
endmacro()

# Every public header is placed, and every table entry names a header.
file(GLOB _pub RELATIVE "${ROOT}/include/apex" "${ROOT}/include/apex/*.h")
foreach(_h IN LISTS _pub)
  _public_layer(${_h} _l)
  if(_l STREQUAL "")
    list(APPEND _errors "include/apex/${_h}: not in check_layers.cmake's table of public headers, add it with its layer")
  endif()
endforeach()
foreach(_p IN LISTS _public_layers)
  string(REGEX REPLACE "=.*" "" _h "${_p}")
  if(NOT EXISTS "${ROOT}/include/apex/${_h}")
    list(APPEND _errors "check_layers.cmake: the table names include/apex/${_h}, which does not exist, drop it")
  endif()
endforeach()

# ---- includes ----------------------------------------------------------------------------------

# _check_includes(<path relative to ROOT> <layer of the file>)
macro(_check_includes rel layer)
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
        list(APPEND _errors "${rel}: includes ${_inc}, which is not a known public header")
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
    if(NOT _to STREQUAL "") # else a system or third-party header
      _edge("${rel}" ${layer} ${_to} "includes \"${_inc}\"")
    endif()
  endforeach()
endmacro()

set(_nfiles 0)
foreach(_h IN LISTS _pub)
  _public_layer(${_h} _l)
  if(NOT _l STREQUAL "")
    _check_includes("include/apex/${_h}" ${_l})
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
    list(APPEND _errors "src/${_d}/: a folder under src/ that APEX_LAYERS (${_layers_str}) does not list, add it in its place")
    continue()
  endif()
  _layer_of(${_d} _dl)
  file(GLOB_RECURSE _files RELATIVE "${ROOT}"
       "${ROOT}/src/${_d}/*.c" "${ROOT}/src/${_d}/*.h" "${ROOT}/src/${_d}/*.cu" "${ROOT}/src/${_d}/*.cuh")
  list(SORT _files)
  foreach(_f IN LISTS _files)
    _check_includes("${_f}" ${_dl})
    math(EXPR _nfiles "${_nfiles} + 1")
  endforeach()
endforeach()

# ---- symbols -----------------------------------------------------------------------------------

set(_nobj 0)
if(DEFINED OBJECTS AND NOT OBJECTS STREQUAL "")
  if(NOT NM)
    message(FATAL_ERROR "check_layers: OBJECTS given without NM (the nm to read them with)")
  endif()
  string(REPLACE "|" ";" _objs "${OBJECTS}")
  # Each object must come from src/<layer>/ (its path in the build tree: .../src/<layer>/<file>.o).
  foreach(_o IN LISTS _objs)
    if(NOT _o MATCHES "/(src/[^/]+/.+)\\.(o|obj)$")
      list(APPEND _errors "${_o}: an object of the library that is not built from src/<layer>/, the check cannot place it")
    endif()
    math(EXPR _nobj "${_nobj} + 1")
  endforeach()
  # Pass 1: who defines what. Pass 2: who needs what. nm -A prefixes each line with its object.
  execute_process(COMMAND ${NM} -A -g --defined-only ${_objs} OUTPUT_VARIABLE _out RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "check_layers: ${NM} failed on the library's objects")
  endif()
  string(REGEX MATCHALL "[^\n]+" _lines "${_out}")
  foreach(_l IN LISTS _lines)
    if(_l MATCHES "/(src/[^/]+/[^:]+)\\.(o|obj): *[0-9a-fA-F]+ [A-Za-z] ([^ ]+)$")
      set("_def_${CMAKE_MATCH_3}" "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  execute_process(COMMAND ${NM} -A -u ${_objs} OUTPUT_VARIABLE _out RESULT_VARIABLE _rc)
  string(REGEX MATCHALL "[^\n]+" _lines "${_out}")
  foreach(_l IN LISTS _lines)
    if(NOT _l MATCHES "/(src/([^/]+)/[^:]+)\\.(o|obj): *U ([^ ]+)$")
      continue()
    endif()
    set(_user "${CMAKE_MATCH_1}")
    set(_sym "${CMAKE_MATCH_4}")
    _layer_of(${CMAKE_MATCH_2} _from)
    if(NOT DEFINED "_def_${_sym}")
      continue() # from the C library or a dependency
    endif()
    set(_definer "${_def_${_sym}}")
    string(REGEX MATCH "^src/([^/]+)/" _m "${_definer}")
    _edge("${_user}" ${_from} ${CMAKE_MATCH_1} "uses ${_sym}, defined in ${_definer}")
  endforeach()
endif()

# ---- verdict -----------------------------------------------------------------------------------

list(LENGTH _errors _nerr)
foreach(_e IN LISTS _errors)
  message("${_e}")
endforeach()
if(_nerr GREATER 0)
  message(FATAL_ERROR "check_layers: ${_nerr} layering error(s) in ${_nfiles} files and ${_nobj} objects")
endif()
message("check_layers: ${_nfiles} files and ${_nobj} objects, every include and symbol within the order ${_layers_str}")
