# Which LibTorch shardfit builds against, and the one fmt every LibTorch
# translation unit sees.
#
# LibTorch, by SHARDFIT_LIBTORCH:
#   venv    the default: the pinned stack's (requirements.lock), the torch
#           wheel that SHARDFIT_VENV_PYTHON imports (default .venv/bin/python,
#           made by scripts/install-deps), found through its
#           share/cmake/Torch. CPU and CUDA: the wheel is a CUDA build.
#   search  CMake's own search: what -DCMAKE_PREFIX_PATH=/path/to/libtorch or
#           -DTorch_DIR names (any LibTorch >= 2.3, or Debian's
#           libtorch-dev 1.13). The default when either is given.
# The wheel's folder goes on CMAKE_PREFIX_PATH twice: share/cmake for
# TorchConfig.cmake, and the folder itself, so that TorchConfig's
# find_library(torch ...) finds the wheel's lib/libtorch.so before a system
# copy (Debian's /usr/lib/x86_64-linux-gnu/libtorch.so would be found first
# otherwise, and the build would mix two LibTorch versions).
if(CMAKE_PREFIX_PATH OR Torch_DIR)
  set(_shardfit_libtorch_default search)
else()
  set(_shardfit_libtorch_default venv)
endif()
set(SHARDFIT_LIBTORCH "${_shardfit_libtorch_default}" CACHE STRING
    "Which LibTorch: venv (the pinned stack's wheel, the default) or search (CMake's search)")
set_property(CACHE SHARDFIT_LIBTORCH PROPERTY STRINGS venv search)
set(SHARDFIT_VENV_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "Python whose torch provides LibTorch with SHARDFIT_LIBTORCH=venv (default: the pinned stack's .venv)")
if(SHARDFIT_LIBTORCH STREQUAL "venv")
  execute_process(
    COMMAND "${SHARDFIT_VENV_PYTHON}" -c "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE _shardfit_torch_root OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _shardfit_torch_rc ERROR_VARIABLE _shardfit_torch_err)
  if(NOT _shardfit_torch_rc EQUAL 0 OR NOT EXISTS "${_shardfit_torch_root}/share/cmake/Torch/TorchConfig.cmake")
    message(FATAL_ERROR "SHARDFIT_LIBTORCH=venv: ${SHARDFIT_VENV_PYTHON} gives no torch with CMake files "
                        "(scripts/install-deps makes .venv/ from requirements.lock): ${_shardfit_torch_err}")
  endif()
  list(PREPEND CMAKE_PREFIX_PATH "${_shardfit_torch_root}" "${_shardfit_torch_root}/share/cmake")
  message(STATUS "shardfit: LibTorch from ${SHARDFIT_VENV_PYTHON}'s torch (${_shardfit_torch_root})")
elseif(NOT SHARDFIT_LIBTORCH STREQUAL "search")
  message(FATAL_ERROR "SHARDFIT_LIBTORCH=${SHARDFIT_LIBTORCH}: choose venv or search")
endif()

find_package(Torch REQUIRED)
# A build folder keeps the LibTorch it found first (Torch_DIR, TORCH_LIBRARY
# are cached): asking one configured with `search` for the wheel would build
# against the old LibTorch without a word. Refused instead.
if(SHARDFIT_LIBTORCH STREQUAL "venv")
  string(FIND "${TORCH_LIBRARY}" "${_shardfit_torch_root}/" _shardfit_torch_at)
  if(NOT _shardfit_torch_at EQUAL 0)
    message(FATAL_ERROR "SHARDFIT_LIBTORCH=venv: ${CMAKE_BINARY_DIR} already found LibTorch at ${TORCH_LIBRARY}, "
                        "and CMake keeps it: configure a new build folder (cmake -S ${CMAKE_SOURCE_DIR} -B build-venv "
                        "-DSHARDFIT_LIBTORCH=venv), or give -DSHARDFIT_LIBTORCH=search here")
  endif()
endif()
if(Torch_VERSION VERSION_EQUAL 1.13 AND EXISTS "${SHARDFIT_VENV_PYTHON}")
  # A folder configured before the pinned stack became the default keeps
  # SHARDFIT_LIBTORCH=search, and so Debian's 1.13, in its cache.
  message(WARNING "shardfit: ${CMAKE_BINARY_DIR} builds against LibTorch 1.13; the tests and the accuracy "
                  "matrix follow the pinned stack's 2.11 (.venv): configure a new build folder for it")
endif()
if(Torch_VERSION VERSION_LESS 2.3 AND NOT Torch_VERSION VERSION_EQUAL 1.13)
  message(FATAL_ERROR "shardfit: LibTorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}): "
                      "shardfit builds against LibTorch >= 2.3 (or Debian's 1.13)")
endif()
# The Python that loads shardfit's library into PyTorch processes (pytorch/,
# tests/pytorch/, scripts/pytorch-validate): the one whose torch is this
# LibTorch, so that one c10, one allocator and one dispatcher serve both.
if(SHARDFIT_LIBTORCH STREQUAL "venv")
  set(SHARDFIT_PYTHON "${SHARDFIT_VENV_PYTHON}")
elseif(Torch_VERSION VERSION_EQUAL 1.13 AND EXISTS /usr/bin/python3)
  set(SHARDFIT_PYTHON /usr/bin/python3)  # Debian's python3-torch
elseif(EXISTS "${SHARDFIT_VENV_PYTHON}")
  set(SHARDFIT_PYTHON "${SHARDFIT_VENV_PYTHON}")
else()
  set(SHARDFIT_PYTHON python3)
endif()
message(STATUS "shardfit: LibTorch ${Torch_VERSION}; PyTorch processes run ${SHARDFIT_PYTHON}")

# LibTorch 2.12 and later refuse C++17 ("C++20 or later compatible compiler is
# required to use ATen": pytorch/pytorch#178150; meta-pytorch/monarch#4464
# names 2.12). Debian's 1.13 and the 2.11 wheel build as C++17.
if(Torch_VERSION VERSION_GREATER_EQUAL 2.12)
  set(CMAKE_CXX_STANDARD 20)
  message(STATUS "shardfit: LibTorch ${Torch_VERSION} needs C++20; building as C++20")
endif()

# PyPI's torch wheels link a newer libstdc++ statically into libtorch.so and
# export some of it (std::filesystem, std::chrono's time zones:
# pytorch/pytorch#133437, still so in 2.11.0). A program that needs
# libtorch.so before libstdc++.so.6 binds its own std::filesystem calls to
# those copies, and std::filesystem::remove_all there jumps to address 0.
# libstdc++ first among every shardfit binary's libraries keeps the system's.
if(EXISTS "${TORCH_INSTALL_PREFIX}/lib/libtorch.so")
  execute_process(COMMAND nm -D --defined-only "${TORCH_INSTALL_PREFIX}/lib/libtorch.so"
                  OUTPUT_VARIABLE _shardfit_torch_syms ERROR_QUIET)
  if(_shardfit_torch_syms MATCHES " T _ZNSt10filesystem")
    add_link_options("LINKER:--push-state,--no-as-needed" "-lstdc++" "LINKER:--pop-state")
    message(STATUS "shardfit: libtorch.so exports libstdc++'s std::filesystem; linking libstdc++ first")
  endif()
endif()

# One precompiled header for every translation unit that includes LibTorch:
# torch/torch.h alone costs ~15 s per file on a 2-core machine.
add_library(shardfit_torch_pch INTERFACE)
target_link_libraries(shardfit_torch_pch INTERFACE ${TORCH_LIBRARIES} spdlog::spdlog nlohmann_json::nlohmann_json)

# fmt: the wheel ships its own fmt headers in torch/include/fmt (fmt 12 in
# torch 2.11), and torch/include comes before /usr/include on the path, so
# spdlog (Debian's 1.10, built against Debian's fmt 9) would compile against
# the wheel's and fail (fmt::basic_runtime is gone since fmt 11). LibTorch's
# own headers that use fmt (c10d's logging.h, error.h) compile with fmt 9 as
# well, and libtorch keeps its fmt inside, so spdlog's fmt is the one: put a
# folder holding only a link to it first on every LibTorch unit's path
# (nothing to do when LibTorch's include folder is spdlog's: Debian's).
if(TARGET fmt::fmt AND EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt")
  get_target_property(_shardfit_fmt_inc fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  list(GET _shardfit_fmt_inc 0 _shardfit_fmt_inc)
  if(EXISTS "${_shardfit_fmt_inc}/fmt/format.h" AND NOT "${_shardfit_fmt_inc}" STREQUAL "${TORCH_INSTALL_PREFIX}/include")
    set(_shardfit_fmt_first "${CMAKE_BINARY_DIR}/fmt-first")
    file(MAKE_DIRECTORY "${_shardfit_fmt_first}")
    file(CREATE_LINK "${_shardfit_fmt_inc}/fmt" "${_shardfit_fmt_first}/fmt" SYMBOLIC)
    target_include_directories(shardfit_torch_pch BEFORE INTERFACE "${_shardfit_fmt_first}")
    message(STATUS "shardfit: fmt ${fmt_VERSION} (${_shardfit_fmt_inc}, spdlog's) before LibTorch's own fmt headers")
  endif()
endif()
