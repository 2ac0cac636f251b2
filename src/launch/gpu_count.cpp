#include "launch/gpu_count.h"

#include <dlfcn.h>

namespace tandem::launch {

int visible_gpu_count() {
  // The driver API is the one piece of CUDA every GPU machine has; it is loaded, asked, and
  // unloaded, so the workers start from a process that never initialised CUDA.
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!driver) return 0;
  using Init = int (*)(unsigned int);
  using Count = int (*)(int*);
  auto init = reinterpret_cast<Init>(::dlsym(driver, "cuInit"));
  auto count = reinterpret_cast<Count>(::dlsym(driver, "cuDeviceGetCount"));
  int devices = 0;
  if (!init || !count || init(0) != 0 || count(&devices) != 0) devices = 0;
  ::dlclose(driver);
  return devices;
}

}  // namespace tandem::launch
