// Compiled only with the CUDA/NCCL path. Note [One nccl.h]
// c10d::ProcessGroupNCCL::Options holds an ncclConfig_t by value, and LibTorch's inline code and
// ours allocate and fill it with the layout of the nccl.h each was compiled with. If ours is of
// another NCCL version than LibTorch's, the two disagree on that layout, silently. So the build
// checks it: cmake/TandemTorch.cmake reads LibTorch's NCCL version (the torch wheel's pin on
// nvidia-nccl-cuNN), puts the matching nccl.h first on the include path, and passes the version
// here; this file sees the same include path as every other file of the library.
#include <nccl.h>

#define TANDEM_STR2(x) #x
#define TANDEM_STR(x) TANDEM_STR2(x)

#ifdef TANDEM_LIBTORCH_NCCL_VERSION_CODE
static_assert(NCCL_VERSION_CODE == TANDEM_LIBTORCH_NCCL_VERSION_CODE,
              "nccl.h from " TANDEM_NCCL_INCLUDE_DIR " is NCCL " TANDEM_STR(NCCL_MAJOR) "." TANDEM_STR(
                  NCCL_MINOR) "." TANDEM_STR(NCCL_PATCH) ", but LibTorch was compiled with NCCL "
                  TANDEM_LIBTORCH_NCCL_VERSION " (" TANDEM_LIBTORCH_NCCL_SOURCE "), and a different nccl.h changes "
                  "the layout of c10d::ProcessGroupNCCL::Options (it holds an ncclConfig_t). Install that NCCL "
                  "(pip install nvidia-nccl-cuNN==" TANDEM_LIBTORCH_NCCL_VERSION ") or configure with "
                  "-DTANDEM_NCCL_INCLUDE_DIR=<folder of its nccl.h>");
#endif
