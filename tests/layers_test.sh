#!/usr/bin/env bash
# layers_test.sh LIBTANDEM TANDEM_BINARY: the layers the build enforces.
#  - the launcher is not in the library programs link (its signal handlers stay in the CLI);
#  - the binary that `tandem run` executes loads no LibTorch (Note [Two binaries]).
set -u
lib="$1"; cli="$2"; rc=0
launcher_symbols=$(nm -C "$lib" | grep -c "tandem::launch::")
echo "launcher symbols in $(basename "$lib"): $launcher_symbols"
if [[ $launcher_symbols -ne 0 ]]; then
  nm -C "$lib" | grep "tandem::launch::" | head -5
  echo "FAIL: the library contains launcher code"; rc=1
fi
torch_libraries=$(ldd "$cli" | grep -E "libtorch|libc10|libcuda|libnccl" || true)
echo "LibTorch/CUDA libraries loaded by $(basename "$cli"): ${torch_libraries:-none}"
if [[ -n "$torch_libraries" ]]; then echo "FAIL: the CLI loads LibTorch"; rc=1; fi
if ! "$cli" --version; then echo "FAIL: $cli --version"; rc=1; fi
exit $rc
