#!/bin/sh
# Builds wc.cpp into OUT_DIR/wc.wasm (default: this directory); the compiler's version line goes to
# OUT_DIR/TOOLCHAIN. -fno-exceptions: Debian's wasm32 libc++ is built without exception support
# (wasm exception handling is not in WASI preview 1 toolchains of clang 14).
# Needs (Debian 12): clang lld wasi-libc libclang-rt-dev-wasm32 libc++-dev-wasm32 libc++abi-dev-wasm32
# (libc++abi-dev-wasm32 is called libc++abi-14-dev-wasm32 there). Override the compiler with CXX=...
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cxx=${CXX:-clang++}
cd "$here"
"$cxx" --target=wasm32-wasi -O2 -fno-exceptions -Wall -Wextra -Werror -ffile-prefix-map="$here"=. \
    -Wl,--strip-all -o "$out/wc.wasm.tmp" wc.cpp
chmod 644 "$out/wc.wasm.tmp"
mv "$out/wc.wasm.tmp" "$out/wc.wasm"
"$cxx" --version | head -n 1 > "$out/TOOLCHAIN"
