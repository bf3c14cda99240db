# What shardfit can build for the GPU: detected after find_package(Torch),
# included from the top-level CMakeLists. Two independent questions:
#
# (a) NCCL and the CUDA runtime (headers and libraries) -> the nccl backend
#     (executor/nccl_comm.*) and its tests. They need no CUDA in LibTorch:
#     the backend works on raw device pointers, cudaStream_t and cudaEvent_t,
#     so a CPU-only machine with the toolkit (CI) compiles it.
#       SHARDFIT_WITH_NCCL  AUTO (default: build it when found) | ON (fail
#                           when not found) | OFF (never)
#       SHARDFIT_CUDA_ROOT  where to look first (default $CUDA_HOME, else
#                           /usr/local/cuda)
#       SHARDFIT_NCCL_ROOT  where NCCL is when it is not inside the toolkit
#                           (e.g. the nvidia-nccl pip package's nvidia/nccl)
#     Result: SHARDFIT_NCCL_FOUND, SHARDFIT_NCCL_VERSION and the target
#     shardfit::nccl (NCCL + cudart, headers as SYSTEM).
#
# (b) whether this LibTorch was built with CUDA (the `torch` Python
#     package's, not Debian's) -> SHARDFIT_CUDA_TORCH: the engine's CUDA
#     device path (`run --device cuda`), the CUDA meter
#     (executor/cuda_meter.*, linked into the executor) and the CUDA tests.
#     Only then is the macro SHARDFIT_CUDA_TORCH defined, on
#     shardfit_torch_pch, so every LibTorch translation unit (and the shared
#     precompiled header) sees the same set.
#
# (c) without a CUDA LibTorch: whether the CUDA-only sources (the CUDA meter
#     and the meter factory's CUDA branch) can still be compiled, not linked,
#     against this LibTorch's c10/cuda headers (Debian ships them with its
#     CPU build) and the CUDA runtime headers found in (a).
#       SHARDFIT_CUDA_COMPILE_CHECK  AUTO (default: when both are there) |
#                                    ON (fail when not) | OFF
#     Result: SHARDFIT_CUDA_COMPILE_CHECK (ON/OFF) and
#     SHARDFIT_CUDA_COMPILE_CHECK_DEFINITIONS for the object libraries
#     shardfit_cuda_compile_check (executor/CMakeLists.txt: cuda_meter.cc,
#     meter.cc) and cuda_tests_compile_check (tests/gpu: the CUDA tests),
#     part of `all`; about 25 s of compiling on 2 cores.
#     It checks the code against LibTorch 1.13's CUDA headers; 2.x is
#     checked only by a build against a CUDA LibTorch (scripts/gpu-check).
#
# Also writes ${PROJECT_BINARY_DIR}/generated/shardfit_gpu_config.h
# (SHARDFIT_WITH_NCCL 0/1): a header rather than a -D, so that only the
# files that include it see it and the shared PCH stays valid.
# One status line says what was found.

set(SHARDFIT_WITH_NCCL AUTO CACHE STRING "Build the NCCL backend: AUTO (when found), ON (required) or OFF")
set_property(CACHE SHARDFIT_WITH_NCCL PROPERTY STRINGS AUTO ON OFF)
set(_shardfit_cuda_root_default /usr/local/cuda)
if(DEFINED ENV{CUDA_HOME} AND NOT "$ENV{CUDA_HOME}" STREQUAL "")
  set(_shardfit_cuda_root_default "$ENV{CUDA_HOME}")
endif()
set(SHARDFIT_CUDA_ROOT "${_shardfit_cuda_root_default}" CACHE PATH "CUDA toolkit (or runtime) root searched first for cuda_runtime_api.h, libcudart, nccl.h, libnccl")
set(SHARDFIT_NCCL_ROOT "" CACHE PATH "NCCL root when not inside SHARDFIT_CUDA_ROOT (has include/nccl.h and lib/libnccl.so*)")

# The NCCL API the backend uses: ncclCommInitRankConfig (nonblocking init,
# so a rendezvous can time out), ncclCommGetAsyncError, ncclAvg.
set(SHARDFIT_NCCL_MIN_VERSION 2.14.0)

# ---- (b) LibTorch with CUDA ------------------------------------------------
set(SHARDFIT_CUDA_TORCH OFF)
if(TARGET torch_cuda OR TARGET c10_cuda OR C10_CUDA_LIBRARY OR TORCH_CUDA_LIBRARIES)
  set(SHARDFIT_CUDA_TORCH ON)
endif()
if(SHARDFIT_CUDA_TORCH AND TARGET shardfit_torch_pch)
  target_compile_definitions(shardfit_torch_pch INTERFACE SHARDFIT_CUDA_TORCH)
endif()

# ---- (a) NCCL + CUDA runtime -----------------------------------------------
string(TOUPPER "${SHARDFIT_WITH_NCCL}" _shardfit_with_nccl)
if(NOT _shardfit_with_nccl MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|YES|NO|1|0)$")
  message(FATAL_ERROR "SHARDFIT_WITH_NCCL=${SHARDFIT_WITH_NCCL}: choose AUTO, ON or OFF")
endif()
set(SHARDFIT_NCCL_FOUND OFF)
set(SHARDFIT_NCCL_VERSION "")
set(_shardfit_nccl_why "")
if(_shardfit_with_nccl MATCHES "^(OFF|FALSE|NO|0)$")
  set(_shardfit_nccl_why "disabled (SHARDFIT_WITH_NCCL=OFF)")
else()
  set(_hints ${SHARDFIT_NCCL_ROOT} ${SHARDFIT_CUDA_ROOT})
  find_path(SHARDFIT_CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS ${SHARDFIT_CUDA_ROOT} PATH_SUFFIXES include)
  # The pip wheels ship only the versioned file (libcudart.so.13).
  find_library(SHARDFIT_CUDART_LIBRARY NAMES cudart libcudart.so.13 libcudart.so.12 libcudart.so.11.0
               HINTS ${SHARDFIT_CUDA_ROOT} PATH_SUFFIXES lib64 lib lib/x64)
  find_path(SHARDFIT_NCCL_INCLUDE_DIR nccl.h HINTS ${_hints} PATH_SUFFIXES include)
  find_library(SHARDFIT_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_hints} PATH_SUFFIXES lib64 lib)
  if(NOT SHARDFIT_CUDART_INCLUDE_DIR OR NOT SHARDFIT_CUDART_LIBRARY)
    set(_shardfit_nccl_why "no CUDA runtime (cuda_runtime_api.h, libcudart) under ${SHARDFIT_CUDA_ROOT} or the system paths")
  elseif(NOT SHARDFIT_NCCL_INCLUDE_DIR OR NOT SHARDFIT_NCCL_LIBRARY)
    set(_shardfit_nccl_why "no NCCL (nccl.h, libnccl) under ${_hints} or the system paths")
  else()
    file(STRINGS "${SHARDFIT_NCCL_INCLUDE_DIR}/nccl.h" _v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
    foreach(_part MAJOR MINOR PATCH)
      string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _m "${_v}")
      set(_nccl_${_part} "${CMAKE_MATCH_1}")
    endforeach()
    set(SHARDFIT_NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
    if(SHARDFIT_NCCL_VERSION VERSION_LESS SHARDFIT_NCCL_MIN_VERSION)
      set(_shardfit_nccl_why "NCCL ${SHARDFIT_NCCL_VERSION} at ${SHARDFIT_NCCL_INCLUDE_DIR} is older than ${SHARDFIT_NCCL_MIN_VERSION}")
    else()
      set(SHARDFIT_NCCL_FOUND ON)
    endif()
  endif()
  if(NOT SHARDFIT_NCCL_FOUND AND _shardfit_with_nccl MATCHES "^(ON|TRUE|YES|1)$")
    message(FATAL_ERROR "SHARDFIT_WITH_NCCL=ON but ${_shardfit_nccl_why}: set SHARDFIT_CUDA_ROOT / SHARDFIT_NCCL_ROOT, or use AUTO/OFF")
  endif()
endif()

if(SHARDFIT_NCCL_FOUND AND NOT TARGET shardfit::nccl)
  add_library(shardfit_nccl_deps INTERFACE)
  add_library(shardfit::nccl ALIAS shardfit_nccl_deps)
  # SYSTEM: the CUDA/NCCL headers are not ours to keep -Werror-clean.
  target_include_directories(shardfit_nccl_deps SYSTEM INTERFACE ${SHARDFIT_NCCL_INCLUDE_DIR} ${SHARDFIT_CUDART_INCLUDE_DIR})
  target_link_libraries(shardfit_nccl_deps INTERFACE ${SHARDFIT_NCCL_LIBRARY} ${SHARDFIT_CUDART_LIBRARY})
endif()
# The CUDA meter needs the runtime too (cudaMemGetInfo), with or without NCCL.
if(SHARDFIT_CUDA_TORCH AND NOT TARGET shardfit::cudart)
  find_path(SHARDFIT_CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS ${SHARDFIT_CUDA_ROOT} PATH_SUFFIXES include)
  find_library(SHARDFIT_CUDART_LIBRARY NAMES cudart libcudart.so.13 libcudart.so.12 libcudart.so.11.0
               HINTS ${SHARDFIT_CUDA_ROOT} PATH_SUFFIXES lib64 lib lib/x64)
  add_library(shardfit_cudart_deps INTERFACE)
  add_library(shardfit::cudart ALIAS shardfit_cudart_deps)
  if(TARGET torch::cudart)  # LibTorch's own (cmake/public/cuda.cmake): the runtime torch_cuda uses
    target_link_libraries(shardfit_cudart_deps INTERFACE torch::cudart)
  elseif(SHARDFIT_CUDART_INCLUDE_DIR AND SHARDFIT_CUDART_LIBRARY)
    target_include_directories(shardfit_cudart_deps SYSTEM INTERFACE ${SHARDFIT_CUDART_INCLUDE_DIR})
    target_link_libraries(shardfit_cudart_deps INTERFACE ${SHARDFIT_CUDART_LIBRARY})
  else()
    message(FATAL_ERROR "LibTorch has CUDA but the CUDA runtime (cuda_runtime_api.h, libcudart) was not found: set SHARDFIT_CUDA_ROOT")
  endif()
endif()

# ---- (c) compile check of the CUDA-only sources ------------------------------
set(SHARDFIT_CUDA_COMPILE_CHECK AUTO CACHE STRING "Compile (not link) the CUDA-only sources against LibTorch's c10/cuda headers when LibTorch is CPU-only: AUTO, ON or OFF")
set_property(CACHE SHARDFIT_CUDA_COMPILE_CHECK PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${SHARDFIT_CUDA_COMPILE_CHECK}" _shardfit_cc)
set(_shardfit_cc_why "")
set(SHARDFIT_CUDA_COMPILE_CHECK_DEFINITIONS "")
if(_shardfit_cc MATCHES "^(OFF|FALSE|NO|0)$")
  set(_shardfit_cc_why "disabled (SHARDFIT_CUDA_COMPILE_CHECK=OFF)")
elseif(SHARDFIT_CUDA_TORCH)
  set(_shardfit_cc_why "not needed: LibTorch has CUDA, the CUDA sources are built and linked")
else()
  find_path(SHARDFIT_C10_CUDA_INCLUDE_DIR c10/cuda/CUDACachingAllocator.h HINTS ${TORCH_INCLUDE_DIRS})
  if(NOT SHARDFIT_C10_CUDA_INCLUDE_DIR)
    set(_shardfit_cc_why "LibTorch ships no c10/cuda headers")
  elseif(NOT SHARDFIT_CUDART_INCLUDE_DIR)
    set(_shardfit_cc_why "no cuda_runtime_api.h under ${SHARDFIT_CUDA_ROOT}")
  else()
    # A CPU build does not generate c10/cuda/impl/cuda_cmake_macros.h (it
    # only says whether c10_cuda is a shared library, which matters on
    # Windows); c10's own switch skips it.
    if(NOT EXISTS "${SHARDFIT_C10_CUDA_INCLUDE_DIR}/c10/cuda/impl/cuda_cmake_macros.h")
      list(APPEND SHARDFIT_CUDA_COMPILE_CHECK_DEFINITIONS C10_CUDA_NO_CMAKE_CONFIGURE_FILE)
    endif()
  endif()
endif()
if(_shardfit_cc_why STREQUAL "")
  set(SHARDFIT_CUDA_COMPILE_CHECK ON)
else()
  if(_shardfit_cc MATCHES "^(ON|TRUE|YES|1)$" AND NOT SHARDFIT_CUDA_TORCH)
    message(FATAL_ERROR "SHARDFIT_CUDA_COMPILE_CHECK=ON but ${_shardfit_cc_why}")
  endif()
  set(SHARDFIT_CUDA_COMPILE_CHECK OFF)
endif()

set(SHARDFIT_WITH_NCCL_VALUE 0)
if(SHARDFIT_NCCL_FOUND)
  set(SHARDFIT_WITH_NCCL_VALUE 1)
endif()
file(CONFIGURE OUTPUT "${PROJECT_BINARY_DIR}/generated/shardfit_gpu_config.h" CONTENT
"// Generated by cmake/ShardfitCuda.cmake: what this build has for the GPU.
#pragma once
// 1 when the nccl backend (executor/nccl_comm.cc) is compiled and linked.
#define SHARDFIT_WITH_NCCL ${SHARDFIT_WITH_NCCL_VALUE}
")
set(SHARDFIT_GENERATED_INCLUDE_DIR "${PROJECT_BINARY_DIR}/generated")

if(SHARDFIT_NCCL_FOUND)
  set(_nccl_msg "NCCL ${SHARDFIT_NCCL_VERSION} (${SHARDFIT_NCCL_LIBRARY}) + cudart (${SHARDFIT_CUDART_LIBRARY}): nccl backend ON")
else()
  set(_nccl_msg "nccl backend OFF: ${_shardfit_nccl_why}")
endif()
if(SHARDFIT_CUDA_TORCH)
  set(_torch_msg "LibTorch ${Torch_VERSION} has CUDA: CUDA engine path, CUDA meter and CUDA tests ON (SHARDFIT_CUDA_TORCH)")
elseif(SHARDFIT_CUDA_COMPILE_CHECK)
  set(_torch_msg "LibTorch ${Torch_VERSION} is CPU-only: CUDA engine path and CUDA tests OFF; compile check of the CUDA-only sources and tests ON (no link)")
else()
  set(_torch_msg "LibTorch ${Torch_VERSION} is CPU-only: CUDA engine path and CUDA tests OFF; compile check of the CUDA-only sources OFF (${_shardfit_cc_why})")
endif()
message(STATUS "shardfit GPU: ${_nccl_msg}; ${_torch_msg}")
