# Locates LibTorch inside the pinned `torch` wheel and defines the imported target
# `tandem::torch`. We do not use the wheel's TorchConfig.cmake: a CUDA build of it refuses to
# configure on a machine without the CUDA toolkit, and Tandem must build its CPU path there.
#
# Inputs (all optional):
#   TANDEM_TORCH_ROOT  the wheel's `torch` package folder (holds include/ and lib/)
#   TANDEM_PYTHON      an interpreter that can `import torch` (default: <project>/.venv/bin/python,
#                      then python3)
#   TANDEM_WITH_CUDA   AUTO (default) | ON | OFF: compile the CUDA / NCCL path
# Outputs: tandem::torch, TANDEM_TORCH_ROOT, TANDEM_TORCH_VERSION, TANDEM_HAVE_CUDA.
include_guard(GLOBAL)

if(NOT TANDEM_TORCH_ROOT)
  if(NOT TANDEM_PYTHON)
    get_filename_component(_tandem_src "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
    if(EXISTS "${_tandem_src}/.venv/bin/python")
      set(TANDEM_PYTHON "${_tandem_src}/.venv/bin/python")
    else()
      find_program(TANDEM_PYTHON NAMES python3 python REQUIRED)
    endif()
  endif()
  # find_spec locates the package without importing it (importing torch takes seconds).
  execute_process(
    COMMAND "${TANDEM_PYTHON}" -c "import importlib.util,os; print(os.path.dirname(importlib.util.find_spec('torch').origin))"
    OUTPUT_VARIABLE _tandem_torch_root OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _rc ERROR_QUIET)
  if(NOT _rc EQUAL 0 OR NOT EXISTS "${_tandem_torch_root}/lib")
    message(FATAL_ERROR "Tandem: cannot find the torch wheel with ${TANDEM_PYTHON}. "
                        "Run scripts/setup, or pass -DTANDEM_TORCH_ROOT=<site-packages>/torch.")
  endif()
  set(TANDEM_TORCH_ROOT "${_tandem_torch_root}" CACHE PATH "torch wheel package folder")
endif()

set(_lib "${TANDEM_TORCH_ROOT}/lib")
if(NOT EXISTS "${_lib}/libtorch_cpu.so")
  message(FATAL_ERROR "Tandem: ${_lib}/libtorch_cpu.so not found (TANDEM_TORCH_ROOT=${TANDEM_TORCH_ROOT})")
endif()
foreach(_part MAJOR MINOR PATCH)
  file(STRINGS "${TANDEM_TORCH_ROOT}/include/torch/headeronly/version.h" _line
       REGEX "define TORCH_VERSION_${_part} ")
  string(REGEX MATCH "[0-9]+$" _v_${_part} "${_line}")
endforeach()
set(TANDEM_TORCH_VERSION "${_v_MAJOR}.${_v_MINOR}.${_v_PATCH}")

add_library(tandem::torch INTERFACE IMPORTED GLOBAL)
target_include_directories(tandem::torch SYSTEM INTERFACE
  "${TANDEM_TORCH_ROOT}/include" "${TANDEM_TORCH_ROOT}/include/torch/csrc/api/include")
# The wheel is built with the C++11 ABI and with c10d + Gloo; the Gloo headers come from Debian
# (see docs/design/comm.md for why that is sound).
target_compile_definitions(tandem::torch INTERFACE
  _GLIBCXX_USE_CXX11_ABI=1 USE_DISTRIBUTED USE_C10D_GLOO)
target_link_libraries(tandem::torch INTERFACE "${_lib}/libtorch_cpu.so" "${_lib}/libc10.so")


# NCCL_VERSION_CODE as nccl.h's NCCL_VERSION(X,Y,Z) computes it from "X.Y.Z".
function(_tandem_nccl_version_code out version)
  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)\\.([0-9]+)" _ "${version}")
  if(CMAKE_MATCH_1 LESS_EQUAL 2 AND CMAKE_MATCH_2 LESS_EQUAL 8)
    math(EXPR code "${CMAKE_MATCH_1} * 1000 + ${CMAKE_MATCH_2} * 100 + ${CMAKE_MATCH_3}")
  else()
    math(EXPR code "${CMAKE_MATCH_1} * 10000 + ${CMAKE_MATCH_2} * 100 + ${CMAKE_MATCH_3}")
  endif()
  set(${out} ${code} PARENT_SCOPE)
endfunction()

# "X.Y.Z" of the nccl.h in `dir`, or "" where it has none.
function(_tandem_nccl_header_version out dir)
  set(version "")
  if(EXISTS "${dir}/nccl.h")
    foreach(part MAJOR MINOR PATCH)
      file(STRINGS "${dir}/nccl.h" line REGEX "^#define NCCL_${part} +[0-9]+")
      string(REGEX MATCH "[0-9]+$" v_${part} "${line}")
    endforeach()
    set(version "${v_MAJOR}.${v_MINOR}.${v_PATCH}")
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

# The NCCL version LibTorch was compiled with, so that our nccl.h can be checked against it
# (src/comm/nccl_header_check.cpp): -DTANDEM_LIBTORCH_NCCL_VERSION=X.Y.Z if given, else the
# torch wheel's pin (METADATA: "Requires-Dist: nvidia-nccl-cuNN==X.Y.Z"), else the version of the
# nvidia-nccl wheel installed beside it. Sets TANDEM_LIBTORCH_NCCL_VERSION ("" when unknown, as
# for a plain LibTorch download), _CODE and _SOURCE.
function(tandem_libtorch_nccl_version)
  get_filename_component(site "${TANDEM_TORCH_ROOT}/.." ABSOLUTE)
  set(version "")
  set(source "")
  set(installed "")
  file(GLOB nccl_infos "${site}/nvidia_nccl_cu*-*.dist-info")
  foreach(info IN LISTS nccl_infos)
    get_filename_component(name "${info}" NAME)
    if(NOT installed AND name MATCHES "^nvidia_nccl_cu[0-9]+-([0-9]+\\.[0-9]+\\.[0-9]+)")
      set(installed "${CMAKE_MATCH_1}")
      set(installed_source "${name}")
    endif()
  endforeach()
  if(TANDEM_LIBTORCH_NCCL_VERSION)
    set(version "${TANDEM_LIBTORCH_NCCL_VERSION}")
    set(source "-DTANDEM_LIBTORCH_NCCL_VERSION")
  else()
    file(GLOB metas "${site}/torch-${TANDEM_TORCH_VERSION}*.dist-info/METADATA")
    foreach(meta IN LISTS metas)
      file(STRINGS "${meta}" pin REGEX "^Requires-Dist: *nvidia-nccl-cu[0-9]+ *==")
      if(NOT version AND pin MATCHES "==([0-9]+\\.[0-9]+\\.[0-9]+)")
        set(version "${CMAKE_MATCH_1}")
        get_filename_component(dist "${meta}" DIRECTORY)
        get_filename_component(dist "${dist}" NAME)
        set(source "${dist}/METADATA")
      endif()
    endforeach()
    if(NOT version AND installed)
      set(version "${installed}")
      set(source "${installed_source}")
    elseif(version AND installed AND NOT installed STREQUAL version)
      message(STATUS "Tandem: note: nvidia-nccl ${installed} is installed, but LibTorch was built against "
                     "${version} (its pin); the header check uses the pin")
    endif()
  endif()
  set(code "")
  if(version)
    if(NOT version MATCHES "^[0-9]+\\.[0-9]+\\.[0-9]+")
      message(FATAL_ERROR "Tandem: TANDEM_LIBTORCH_NCCL_VERSION='${version}' is not X.Y.Z")
    endif()
    _tandem_nccl_version_code(code "${version}")
  endif()
  set(TANDEM_LIBTORCH_NCCL_VERSION "${version}" PARENT_SCOPE)
  set(TANDEM_LIBTORCH_NCCL_VERSION_CODE "${code}" PARENT_SCOPE)
  set(TANDEM_LIBTORCH_NCCL_SOURCE "${source}" PARENT_SCOPE)
endfunction()

# nccl.h: TANDEM_NCCL_INCLUDE_DIR if set; else, of the wheel's nvidia-nccl, the toolkit's and the
# system's, the first whose version is LibTorch's; else the first found (the build then stops at
# src/comm/nccl_header_check.cpp, which says what to do). Sets TANDEM_NCCL_INCLUDE_DIR and
# TANDEM_NCCL_HEADER_VERSION.
function(tandem_pick_nccl_header)
  if(TANDEM_NCCL_INCLUDE_DIR AND EXISTS "${TANDEM_NCCL_INCLUDE_DIR}/nccl.h")
    set(picked "${TANDEM_NCCL_INCLUDE_DIR}")
  else()
    get_filename_component(site "${TANDEM_TORCH_ROOT}/.." ABSOLUTE)
    find_path(_tandem_system_nccl nccl.h)
    set(first "")
    set(picked "")
    foreach(dir "${site}/nvidia/nccl/include" ${TANDEM_CUDA_INCLUDE_DIRS} ${_tandem_system_nccl})
      _tandem_nccl_header_version(v "${dir}")
      if(v AND NOT first)
        set(first "${dir}")
      endif()
      if(v AND NOT picked AND TANDEM_LIBTORCH_NCCL_VERSION AND v VERSION_EQUAL TANDEM_LIBTORCH_NCCL_VERSION)
        set(picked "${dir}")
      endif()
    endforeach()
    if(NOT picked)
      set(picked "${first}")
    endif()
  endif()
  _tandem_nccl_header_version(v "${picked}")
  if(picked AND TANDEM_LIBTORCH_NCCL_VERSION AND NOT v VERSION_EQUAL TANDEM_LIBTORCH_NCCL_VERSION)
    message(WARNING "Tandem: no nccl.h of LibTorch's NCCL ${TANDEM_LIBTORCH_NCCL_VERSION} was found; "
                    "${picked}/nccl.h is ${v}: the build stops at src/comm/nccl_header_check.cpp")
  endif()
  set(TANDEM_NCCL_INCLUDE_DIR "${picked}" PARENT_SCOPE)
  set(TANDEM_NCCL_HEADER_VERSION "${v}" PARENT_SCOPE)
endfunction()

set(TANDEM_HAVE_CUDA OFF)
if(NOT DEFINED TANDEM_WITH_CUDA)
  set(TANDEM_WITH_CUDA AUTO)
endif()
if(NOT TANDEM_WITH_CUDA STREQUAL "OFF" AND EXISTS "${_lib}/libtorch_cuda.so")
  # The toolkit is the one whose nvcc is on PATH (symlinks resolved), wherever it lives, unless
  # CUDAToolkit_ROOT says otherwise: FindCUDAToolkit alone looks in a few fixed places first.
  if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT})
    find_program(TANDEM_NVCC nvcc)
    if(TANDEM_NVCC)
      get_filename_component(_nvcc "${TANDEM_NVCC}" REALPATH)
      get_filename_component(_nvcc_bin "${_nvcc}" DIRECTORY)
      get_filename_component(CUDAToolkit_ROOT "${_nvcc_bin}" DIRECTORY)
    endif()
  endif()
  find_package(CUDAToolkit QUIET)
  set(TANDEM_CUDA_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS})
  if(NOT CUDAToolkit_FOUND AND TANDEM_WITH_CUDA STREQUAL "ON")
    # Asked for explicitly: the CUDA runtime headers the wheel itself ships will do (nothing of
    # ours is compiled by nvcc; LibTorch's headers need the runtime API's declarations only).
    foreach(_dir "${CUDAToolkit_ROOT}/include" "${TANDEM_TORCH_ROOT}/../nvidia/cu13/include"
                 "${TANDEM_TORCH_ROOT}/../nvidia/cuda_runtime/include")
      if(NOT TANDEM_CUDA_INCLUDE_DIRS AND EXISTS "${_dir}/cuda_runtime_api.h")
        get_filename_component(TANDEM_CUDA_INCLUDE_DIRS "${_dir}" ABSOLUTE)
        message(STATUS "Tandem: no CUDA toolkit found; using the CUDA runtime headers in ${TANDEM_CUDA_INCLUDE_DIRS}")
      endif()
    endforeach()
  endif()
  tandem_libtorch_nccl_version()
  tandem_pick_nccl_header()
  # The CUDA runtime LibTorch itself loads (the wheel's nvidia-cuda-runtime), else the toolkit's.
  find_library(TANDEM_CUDART_LIBRARY NAMES libcudart.so.13 libcudart.so.12 cudart
    HINTS "${TANDEM_TORCH_ROOT}/../nvidia/cu13/lib" "${TANDEM_TORCH_ROOT}/../nvidia/cuda_runtime/lib"
    NO_DEFAULT_PATH)
  if(TANDEM_CUDA_INCLUDE_DIRS AND TANDEM_NCCL_INCLUDE_DIR AND (TANDEM_CUDART_LIBRARY OR CUDAToolkit_FOUND))
    set(TANDEM_HAVE_CUDA ON)
  endif()
endif()
if(TANDEM_WITH_CUDA STREQUAL "ON" AND NOT TANDEM_HAVE_CUDA)
  message(FATAL_ERROR "Tandem: TANDEM_WITH_CUDA=ON but the CUDA toolkit (nvcc on PATH, or CUDAToolkit_ROOT), "
                      "nccl.h or libtorch_cuda.so is missing")
endif()

if(TANDEM_HAVE_CUDA)
  add_library(tandem::torch_cuda INTERFACE IMPORTED GLOBAL)
  # nccl.h's folder before the toolkit's: a toolkit may ship an nccl.h of another version.
  target_include_directories(tandem::torch_cuda SYSTEM INTERFACE
    "${TANDEM_NCCL_INCLUDE_DIR}" ${TANDEM_CUDA_INCLUDE_DIRS})
  target_compile_definitions(tandem::torch_cuda INTERFACE USE_CUDA USE_C10D_NCCL TANDEM_HAVE_CUDA=1)
  # --no-as-needed: nothing of ours may reference libtorch_cuda directly, but loading it is what
  # registers the CUDA kernels and allocator with the dispatcher.
  if(NOT TANDEM_CUDART_LIBRARY)
    set(TANDEM_CUDART_LIBRARY CUDA::cudart)
  endif()
  target_link_libraries(tandem::torch_cuda INTERFACE
    "-Wl,--no-as-needed,${_lib}/libtorch_cuda.so,${_lib}/libc10_cuda.so" "-Wl,--as-needed"
    ${TANDEM_CUDART_LIBRARY} tandem::torch)
endif()
message(STATUS "Tandem: LibTorch ${TANDEM_TORCH_VERSION} at ${TANDEM_TORCH_ROOT}; CUDA/NCCL path: ${TANDEM_HAVE_CUDA}")
if(TANDEM_HAVE_CUDA)
  message(STATUS "Tandem: CUDA headers ${TANDEM_CUDA_INCLUDE_DIRS}; nccl.h ${TANDEM_NCCL_HEADER_VERSION} "
                 "from ${TANDEM_NCCL_INCLUDE_DIR}")
  if(TANDEM_LIBTORCH_NCCL_VERSION)
    message(STATUS "Tandem: LibTorch's NCCL ${TANDEM_LIBTORCH_NCCL_VERSION} (${TANDEM_LIBTORCH_NCCL_SOURCE}): "
                   "checked against nccl.h at compile time")
  else()
    message(STATUS "Tandem: LibTorch's NCCL version unknown (no torch dist-info beside ${TANDEM_TORCH_ROOT}: "
                   "a plain LibTorch download?): the nccl.h version check is skipped; "
                   "-DTANDEM_LIBTORCH_NCCL_VERSION=X.Y.Z turns it on")
  endif()
endif()
