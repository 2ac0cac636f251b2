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


set(TANDEM_HAVE_CUDA OFF)
if(NOT DEFINED TANDEM_WITH_CUDA)
  set(TANDEM_WITH_CUDA AUTO)
endif()
if(NOT TANDEM_WITH_CUDA STREQUAL "OFF" AND EXISTS "${_lib}/libtorch_cuda.so")
  find_package(CUDAToolkit QUIET)
  # NCCL's header: the wheel's nvidia-nccl package first (the version LibTorch runs), then the toolkit.
  find_path(TANDEM_NCCL_INCLUDE_DIR nccl.h
    HINTS "${TANDEM_TORCH_ROOT}/../nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS}
    NO_DEFAULT_PATH)
  if(CUDAToolkit_FOUND AND TANDEM_NCCL_INCLUDE_DIR)
    set(TANDEM_HAVE_CUDA ON)
  endif()
endif()
if(TANDEM_WITH_CUDA STREQUAL "ON" AND NOT TANDEM_HAVE_CUDA)
  message(FATAL_ERROR "Tandem: TANDEM_WITH_CUDA=ON but the CUDA toolkit, nccl.h or libtorch_cuda.so is missing")
endif()

if(TANDEM_HAVE_CUDA)
  add_library(tandem::torch_cuda INTERFACE IMPORTED GLOBAL)
  target_include_directories(tandem::torch_cuda SYSTEM INTERFACE
    ${CUDAToolkit_INCLUDE_DIRS} "${TANDEM_NCCL_INCLUDE_DIR}")
  target_compile_definitions(tandem::torch_cuda INTERFACE USE_CUDA USE_C10D_NCCL TANDEM_HAVE_CUDA=1)
  # --no-as-needed: nothing of ours may reference libtorch_cuda directly, but loading it is what
  # registers the CUDA kernels and allocator with the dispatcher.
  # The CUDA runtime LibTorch itself loads (the wheel's nvidia-cuda-runtime), else the toolkit's.
  find_library(TANDEM_CUDART_LIBRARY NAMES libcudart.so.13 libcudart.so.12 cudart
    HINTS "${TANDEM_TORCH_ROOT}/../nvidia/cu13/lib" "${TANDEM_TORCH_ROOT}/../nvidia/cuda_runtime/lib"
    NO_DEFAULT_PATH)
  if(NOT TANDEM_CUDART_LIBRARY)
    set(TANDEM_CUDART_LIBRARY CUDA::cudart)
  endif()
  target_link_libraries(tandem::torch_cuda INTERFACE
    "-Wl,--no-as-needed,${_lib}/libtorch_cuda.so,${_lib}/libc10_cuda.so" "-Wl,--as-needed"
    ${TANDEM_CUDART_LIBRARY} tandem::torch)
endif()
message(STATUS "Tandem: LibTorch ${TANDEM_TORCH_VERSION} at ${TANDEM_TORCH_ROOT}; CUDA/NCCL path: ${TANDEM_HAVE_CUDA}")
