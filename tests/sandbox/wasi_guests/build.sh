#!/bin/sh
# Rebuilds libc_probe.wasm from libc_probe.c (test_wasi_conformance.py runs the committed module and,
# where clang is installed, checks that this script rebuilds it byte for byte).
#
# Deterministic as sandbox/workloads/build.sh: compiled from this directory by relative name, prefix
# maps hide the build path, --strip-all drops names, debug info and the producers section. Needs clang
# with the wasm32-wasi target, wasm-ld and wasi-libc (Debian 12: clang lld wasi-libc
# libclang-rt-dev-wasm32). Usage: build.sh [OUT_DIR]; override the compiler with CC=...
set -eu

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cc=${CC:-clang}

cd "$here"
"$cc" --target=wasm32-wasi -O2 -Wall -Wextra -Werror \
    -ffile-prefix-map="$here"=. -fdebug-prefix-map="$here"=. \
    -Wl,--strip-all -o "$out/libc_probe.wasm.tmp" libc_probe.c
chmod 644 "$out/libc_probe.wasm.tmp"
mv "$out/libc_probe.wasm.tmp" "$out/libc_probe.wasm"
