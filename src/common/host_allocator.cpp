#include "tandem/host_allocator.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "tandem/error.h"

namespace tandem {

// Note [Host allocator]: LibTorch's CPU allocator is malloc (posix_memalign), and glibc serves a
// block above its mmap threshold with a fresh mmap and returns it with munmap when freed; it also
// gives the free top of its heaps back to the kernel past a trim threshold. A training step frees
// and reallocates the same activations every iteration, so each step can fault all of their pages
// in again: thousands of minor faults per step on the benchmark's CNN and transformer, up to 20 %
// of their step on this project's 2-core machine (docs/benchmarks.md, "The Accelerator's step").
// Worse, glibc moves the threshold up by itself when a mapped block is freed (up to 32 MiB), so
// whether a process faults depends on the order of its first frees: the same program lands in a
// fast or a slow mode from one run to the next. That was the "fast and slow mode" of the PyTorch
// peers and the Accelerator's unexplained few percent behind hand-written DDP. With mmap disabled
// for large blocks (M_MMAP_MAX 0) and trimming off (M_TRIM_THRESHOLD -1, "never", per mallopt(3)),
// freed blocks stay in the process and the next step reuses them: the main thread's steady-state
// step faults nothing, and the setting no longer depends on the run. Not covered, as glibc works:
// on a thread other than the main one (DataParallel's replicas, Gloo's threads) a block larger
// than a thread heap (64 MiB) is still mapped afresh, and an emptied thread heap is unmapped; the
// benchmark's DDP ranks still see a few hundred faults per step there, against thousands. The
// price is that memory freed after the peak is not returned to the kernel, which is what a
// caching allocator (PyTorch's CUDA one, jemalloc's) does too; a program that must give memory
// back sets TANDEM_HOST_ALLOCATOR=system.
// FSDP is the program that must give memory back: it allocates a unit's gathered parameters and
// gradients (megabytes each) and frees them a moment later, every step, partly on Gloo's threads.
// Kept for reuse, or under glibc's moving threshold, those blocks spread over several heaps and
// the process grew by a quarter of a gigabyte a step on the budget test's model (134 MB of model
// state per rank: 401 MB of RSS after sharding, 1,264 MB after three steps; keep-freed was no
// better). FSDP's own buffers now come from a pool of their own (Note [Host buffer pool]), and
// the rest follows `return-large`: blocks of 4 MiB or more (a unit's whole gradients from
// autograd, the largest activations) are mapped when allocated and unmapped when freed, with the
// threshold fixed (glibc stops moving it); smaller ones stay in the heap for reuse, never trimmed,
// as under keep-freed. Measured (budget model, 4 ranks; bench at 2 ranks, FSDP's p50 step):
// threshold 1 MiB with trimming: 920 MB peak, medium 135 ms, large 128 ms; 4 MiB, no trimming:
// 920 MB, 101 ms and 122 ms (page faults per step on the medium model from 40,000 to 300);
// 32 MiB: 1,265 MB, the heap's growth again. The setting reports what glibc accepted: under
// another allocator (LD_PRELOAD'ed jemalloc, TSan's) glibc accepts it and nothing changes.
const HostAllocatorSetting& tune_host_allocator(HostAllocatorPolicy preferred) {
  // Checked outside the once-block: an exception escaping std::call_once can leave it locked with
  // some C++ runtimes (GCC PR 66146), and a bad value must fail every call alike.
  const char* choice = std::getenv("TANDEM_HOST_ALLOCATOR");
  if (choice && *choice && std::strcmp(choice, "system") != 0 && std::strcmp(choice, "keep-freed") != 0 &&
      std::strcmp(choice, "return-large") != 0) {
    throw Error(std::string("TANDEM_HOST_ALLOCATOR must be keep-freed, return-large or system (got '") + choice + "')");
  }
  static HostAllocatorSetting setting;
  static std::once_flag once;
  std::call_once(once, [choice, preferred] {
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    if (choice && std::strcmp(choice, "system") == 0) {
      setting.mode = "system";
      setting.detail = "glibc's defaults (TANDEM_HOST_ALLOCATOR=system)";
      return;
    }
    if (tunables && std::strstr(tunables, "glibc.malloc.")) {
      setting.mode = "tunables";
      setting.detail = "GLIBC_TUNABLES sets glibc.malloc, left as it is";
      return;
    }
    const bool return_large = choice && *choice ? std::strcmp(choice, "return-large") == 0
                                                : preferred == HostAllocatorPolicy::ReturnLarge;
#if defined(__GLIBC__)
    // mallopt returns 0 where it is refused: ASan's allocator, which ignores it.
    if (return_large) {
      if (mallopt(M_MMAP_THRESHOLD, 4 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, -1) == 1) {
        setting.mode = "return-large";  // not `tuned`: that names keeping all freed memory
        setting.detail = "blocks of 4 MiB or more returned to the kernel when freed, smaller ones kept "
                         "(mallopt M_MMAP_THRESHOLD=4 MiB, M_TRIM_THRESHOLD=-1)";
      } else {
        setting.mode = "unchanged";
        setting.detail = "the allocator refused mallopt (a sanitizer's?): its defaults";
      }
    } else if (mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, -1) == 1) {
      setting.tuned = true;
      setting.mode = "keep-freed";
      setting.detail = "freed memory kept for reuse (mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1)";
    } else {
      setting.mode = "unchanged";
      setting.detail = "the allocator refused mallopt (a sanitizer's?): its defaults";
    }
#else
    (void)return_large;
    setting.mode = "unchanged";
    setting.detail = "not glibc's malloc: its defaults";
#endif
  });
  return setting;
}

}  // namespace tandem
