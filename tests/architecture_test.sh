#!/usr/bin/env bash
# architecture_test.sh SOURCE_DIR: the library's layers, as docs/design/architecture.md draws them.
#  - a module includes the public headers (tandem/<module>/...) of the modules above it only;
#  - it includes no other module's private headers (src/<module>/..., "<module>/..."), but for
#    common/, the private layer every module shares;
#  - it names no other module's detail:: namespace; nor do the examples, the benchmark workers,
#    or a module's tests another module's (a module's own tests may use its internals).
set -u
root="$1"
# Top to bottom: each may depend on the ones before it.
order=(nn comm data ddp dp zero fsdp tp pp amp accelerate)
rc=0
fail() { echo "FAIL: $*"; rc=1; }
index_of() { local i; for i in "${!order[@]}"; do [[ "${order[$i]}" == "$1" ]] && { echo "$i"; return; }; done; echo -1; }
is_module() { [[ $(index_of "$1") -ge 0 ]]; }

files_of() { find "$root/src/$1" "$root/include/tandem/$1" -name '*.h' -o -name '*.cpp' 2>/dev/null; }

checked=0
for module in "${order[@]}"; do
  mine=$(index_of "$module")
  while IFS= read -r file; do
    [[ -z "$file" ]] && continue
    checked=$((checked + 1))
    rel=${file#"$root"/}
    while IFS= read -r include; do
      target=${include#tandem/}; target=${target%%/*}
      is_module "$target" || continue
      [[ $(index_of "$target") -le $mine ]] || fail "$rel includes $include: $target is below $module"
    done < <(grep -oE '^#include "tandem/[a-z_]+/' "$file" | sed -E 's/#include "//; s/\/$//')
    while IFS= read -r include; do
      target=${include%%/*}
      [[ "$target" == "$module" || "$target" == common || "$target" == tandem ]] && continue
      is_module "$target" && fail "$rel includes \"$include\": a private header of $target"
    done < <(grep -oE '^#include "[a-z_]+/[^"]+' "$file" | sed -E 's/#include "//')
    while IFS= read -r used; do
      target=${used%%::*}
      [[ "$target" == "$module" ]] && continue
      fail "$rel uses $used: $target's internals"
    done < <(grep -oE '\b(nn|comm|data|ddp|dp|zero|fsdp|tp|pp|amp|accelerate)::detail::' "$file" | sort -u)
  done < <(files_of "$module")
done
# Tests may use their own module's internals only; examples and benchmark workers none.
while IFS= read -r file; do
  checked=$((checked + 1))
  rel=${file#"$root"/}
  owner=$(sed -E 's|^tests/([a-z_]+)/.*|\1|' <<<"$rel")
  while IFS= read -r used; do
    target=${used%%::*}
    [[ "$rel" == tests/* && "$target" == "$owner" ]] && continue
    fail "$rel uses $used: $target's internals"
  done < <(grep -oE '\b(nn|comm|data|ddp|dp|zero|fsdp|tp|pp|amp|accelerate)::detail::' "$file" | sort -u)
done < <(cd "$root" && find tests examples bench -name '*.h' -o -name '*.cpp' | sed "s|^|$root/|")
echo "architecture: $checked files checked against the layers ${order[*]}"
exit $rc
