#!/bin/sh
# Builds wc.c into OUT_DIR/wc.wasm (default: this directory); the compiler's version line goes to
# OUT_DIR/TOOLCHAIN. Deterministic: compiled from this directory by relative name, the prefix map
# hides the build path, --strip-all drops the name and producers sections.
# Needs (Debian 12): clang lld wasi-libc libclang-rt-dev-wasm32. Override the compiler with CC=...
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cc=${CC:-clang}
cd "$here"
"$cc" --target=wasm32-wasi -O2 -Wall -Wextra -Werror -ffile-prefix-map="$here"=. \
    -Wl,--strip-all -o "$out/wc.wasm.tmp" wc.c
chmod 644 "$out/wc.wasm.tmp"
mv "$out/wc.wasm.tmp" "$out/wc.wasm"
"$cc" --version | head -n 1 > "$out/TOOLCHAIN"
