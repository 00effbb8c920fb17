# apex_choices.cmake: the build's automatic choices, CUDA, MPI, NCCL and oneDNN, following what is
# installed (included by ../CMakeLists.txt).
#
# Each of APEX_CUDA, APEX_MPI, APEX_NCCL and APEX_ONEDNN is a cache entry AUTO (the default), ON or
# OFF. AUTO is detected again at every configure: a build directory configured before `scripts/deps`
# installed Open MPI gets MPI (and so `--distributed`, and NCCL with CUDA) at its next configure, which
# any build runs after a CMakeLists change, or `cmake -S . -B build` does at once. The cache keeps
# only what the user said (an option() cached the detected OFF, and it stuck); ON requires the
# package (configure fails naming what is missing), OFF leaves it out. After this file each APEX_<X>
# is a plain ON/OFF variable for the rest of the configure, and one status line lists what was found
# and what it turns on.
#
# A build directory from before AUTO holds option()'s ON/OFF, which cannot tell a detected value from
# the user's: ON becomes AUTO (the same build while the package is there); OFF is kept as the user's
# (a `-DAPEX_CUDA=OFF` given with this configure looks the same), and a second status line says how
# to follow what is installed instead.

set(_apex_choice_help_CUDA "CUDA backend, --device cuda: AUTO (when nvcc is found; re-detected at every configure), ON (required) or OFF")
set(_apex_choice_help_MPI "MPI process group, --distributed: AUTO (when MPI is found; re-detected at every configure), ON (required) or OFF")
set(_apex_choice_help_NCCL "NCCL process group, --distributed --device cuda (needs CUDA and MPI; nccl.h and libnccl under the CUDA toolkit or NCCL_ROOT): AUTO, ON (required) or OFF")
set(_apex_choice_help_ONEDNN "oneDNN bf16 matrix products on CPUs with AVX512_BF16 or AMX (Debian: libdnnl-dev): AUTO, ON (required) or OFF")

set(_apex_legacy "")
foreach(_c CUDA MPI NCCL ONEDNN)
  set(_v APEX_${_c})
  get_property(_type CACHE ${_v} PROPERTY TYPE) # option() made BOOL entries; -DAPEX_X=V alone makes UNINITIALIZED
  if(DEFINED CACHE{${_v}} AND NOT DEFINED CACHE{_APEX_CHOICES_AUTO} AND _type STREQUAL "BOOL")
    get_property(_old CACHE ${_v} PROPERTY VALUE)
    string(TOUPPER "${_old}" _old)
    if(_old STREQUAL "ON")
      set_property(CACHE ${_v} PROPERTY VALUE AUTO)
    else()
      list(APPEND _apex_legacy ${_c})
    endif()
  endif()
  set(${_v} AUTO CACHE STRING "${_apex_choice_help_${_c}}")
  set_property(CACHE ${_v} PROPERTY TYPE STRING)
  set_property(CACHE ${_v} PROPERTY HELPSTRING "${_apex_choice_help_${_c}}")
  set_property(CACHE ${_v} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "$CACHE{${_v}}" _want)
  if(_want MATCHES "^(ON|1|TRUE|YES|Y)$")
    set(_want ON)
  elseif(_want MATCHES "^(OFF|0|FALSE|NO|N)$")
    set(_want OFF)
  elseif(NOT _want STREQUAL "AUTO")
    message(FATAL_ERROR "apex: ${_v}=$CACHE{${_v}}: give AUTO (detect it at every configure), ON or OFF")
  endif()
  set(_apex_want_${_c} ${_want})
endforeach()
set(_APEX_CHOICES_AUTO 1 CACHE INTERNAL "APEX_CUDA, APEX_MPI, APEX_NCCL and APEX_ONEDNN take AUTO, ON or OFF")

# Forgets a package's cached misses (the find_* results that end in NOTFOUND), so that a package
# installed since is looked for again; hits stay, so a found package costs nothing to keep.
function(_apex_forget_misses prefix_regex)
  get_cmake_property(_vars CACHE_VARIABLES)
  foreach(_var IN LISTS _vars)
    if(_var MATCHES "${prefix_regex}")
      get_property(_val CACHE ${_var} PROPERTY VALUE)
      if(_val MATCHES "NOTFOUND$")
        unset(${_var} CACHE)
      endif()
    endif()
  endforeach()
endfunction()

# A choice's outcome: found -> ON; not found -> OFF, or a configure error when the user said ON.
macro(_apex_decide name found what)
  if(${found})
    set(APEX_${name} ON)
  elseif(_apex_want_${name} STREQUAL "ON")
    message(FATAL_ERROR "apex: APEX_${name}=ON, but ${what} was not found; install it, or configure with -DAPEX_${name}=AUTO or OFF")
  else()
    set(APEX_${name} OFF)
  endif()
endmacro()

# ---- CUDA: nvcc ----
set(_apex_found_CUDA OFF)
if(NOT _apex_want_CUDA STREQUAL "OFF")
  # check_language caches its miss (and a compiler removed since is a stale hit): look again.
  if(DEFINED CACHE{CMAKE_CUDA_COMPILER} AND (NOT CMAKE_CUDA_COMPILER OR NOT EXISTS "${CMAKE_CUDA_COMPILER}"))
    unset(CMAKE_CUDA_COMPILER CACHE)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(_apex_found_CUDA ON)
  endif()
endif()
_apex_decide(CUDA _apex_found_CUDA "a CUDA compiler (nvcc on the PATH, or CUDACXX)")
if(APEX_CUDA)
  # sm_80 (A100) and sm_90 (H100/H200). -fmad=false: no multiply-add contraction, so that the fused
  # optimizers compute the CPU kernels' exact bits (see src/backend/cuda/optim.cu).
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  set(CMAKE_CUDA_STANDARD 17)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
endif()

# ---- MPI ----
set(_apex_found_MPI OFF)
if(NOT _apex_want_MPI STREQUAL "OFF")
  _apex_forget_misses("^MPI_")
  find_package(MPI QUIET COMPONENTS C)
  if(MPI_C_FOUND)
    set(_apex_found_MPI ON)
  endif()
endif()
_apex_decide(MPI _apex_found_MPI "MPI for C (Debian: libopenmpi-dev openmpi-bin)")

# ---- oneDNN ----
set(_apex_found_ONEDNN OFF)
if(NOT _apex_want_ONEDNN STREQUAL "OFF")
  _apex_forget_misses("^APEX_DNNL_")
  find_path(APEX_DNNL_INCLUDE_DIR dnnl.h)
  find_library(APEX_DNNL_LIBRARY dnnl)
  if(APEX_DNNL_INCLUDE_DIR AND APEX_DNNL_LIBRARY)
    set(_apex_found_ONEDNN ON)
  endif()
endif()
_apex_decide(ONEDNN _apex_found_ONEDNN "oneDNN (dnnl.h and libdnnl; Debian: libdnnl-dev)")
set(APEX_HAVE_DNNL_BUILD ${APEX_ONEDNN})

# ---- NCCL: bootstraps over MPI, runs on CUDA ----
set(_apex_found_NCCL OFF)
set(_apex_nccl_why "")
set(_apex_nccl_off "")
if(NOT _apex_want_NCCL STREQUAL "OFF")
  if(APEX_CUDA AND APEX_MPI)
    _apex_forget_misses("^APEX_NCCL_")
    find_path(APEX_NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(APEX_NCCL_LIBRARY nccl HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
    if(APEX_NCCL_INCLUDE_DIR AND APEX_NCCL_LIBRARY)
      set(_apex_found_NCCL ON)
    else()
      set(_apex_nccl_why " (not under the CUDA toolkit ${CUDAToolkit_LIBRARY_DIR}; set NCCL_ROOT)")
    endif()
  else()
    set(_apex_nccl_off " (needs CUDA and MPI)")
  endif()
endif()
_apex_decide(NCCL _apex_found_NCCL "NCCL${_apex_nccl_why}${_apex_nccl_off}")
set(APEX_HAVE_NCCL_BUILD ${APEX_NCCL})

# ---- the one status line ----
set(_apex_on_CUDA "--device cuda")
set(_apex_on_MPI "--distributed")
set(_apex_on_NCCL "--distributed --device cuda")
set(_apex_on_ONEDNN "bf16 products on AVX512_BF16/AMX")
set(_apex_parts "")
foreach(_c CUDA MPI NCCL ONEDNN)
  if(APEX_${_c})
    set(_state "found: ${_apex_on_${_c}}")
  elseif(_apex_want_${_c} STREQUAL "OFF")
    set(_state "off (APEX_${_c}=OFF)")
  elseif(_c STREQUAL "NCCL" AND _apex_nccl_off)
    set(_state "off${_apex_nccl_off}")
  elseif(_c STREQUAL "NCCL")
    set(_state "not found${_apex_nccl_why}")
  else()
    set(_state "not found")
  endif()
  list(APPEND _apex_parts "${_c} ${_state}")
endforeach()
list(JOIN _apex_parts "; " _apex_line)
message(STATUS "apex: ${_apex_line}")
foreach(_c IN LISTS _apex_legacy)
  if(_apex_want_${_c} STREQUAL "OFF")
    message(STATUS "apex: APEX_${_c}=OFF comes from this build directory's cache, written before apex re-detected its choices "
                   "at every configure: configure once with -DAPEX_${_c}=AUTO to follow what is installed")
  endif()
endforeach()
