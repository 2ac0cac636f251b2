#!/usr/bin/env bash
# headers_under_clang.sh SOURCE TORCH_ROOT: every public header (include/tandem/**/*.h) in one
# translation unit, parsed by clang++ in C++17. The project builds with GCC, which accepts some
# code clang refuses (a nested class naming a member type declared below it; a lambda capturing
# a structured binding); a user building with clang includes these headers. Exit 77 (skip) where
# clang++ is absent.
set -eu
source_dir="$1"; torch="$2"
command -v clang++ >/dev/null || { echo "clang++ not found: skipped"; exit 77; }
tu="$(mktemp --suffix=.cpp)"
trap 'rm -f "$tu"' EXIT
(cd "$source_dir/include" && find tandem -name '*.h' | sort | sed 's/.*/#include "&"/') > "$tu"
echo "$(wc -l < "$tu") public headers"
clang++ -std=c++17 -fsyntax-only -DUSE_C10D_GLOO -DUSE_DISTRIBUTED -I"$source_dir/include" \
  -isystem "$torch/include" -isystem "$torch/include/torch/csrc/api/include" "$tu"
echo "every public header parses under $(clang++ --version | head -1)"
