#!/bin/sh
# Rebuilds every workload (*.c) into OUT_DIR/NAME.wasm (default: this directory).
#
# Deterministic: same compiler, same bytes. Sources are compiled from this directory by relative
# name, prefix maps hide the build paths, and --strip-all drops the name, debug and producers
# sections, so no path or timestamp reaches the module. The compiler's version line goes to
# OUT_DIR/TOOLCHAIN; the shipped modules were built by the compiler named in ./TOOLCHAIN.
#
# Needs clang with the wasm32-wasi target, wasm-ld and wasi-libc (Debian: clang lld wasi-libc
# libclang-rt-dev-wasm32). Override the compiler with CC=...
set -eu

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cc=${CC:-clang}

cd "$here"
for src in *.c; do
    name=${src%.c}
    # Per-module extra flags. generate uses wasm SIMD (its dot products are explicit 4-lane vectors): the
    # scalar and SIMD builds round differently, so -msimd128 is part of that job's one pinned build.
    # -disable-lsr keeps LLVM's loop strength reduction from rewriting the matmul's addresses into forms
    # whose constant offsets wasm loads cannot take as immediates (18% less fuel per token, same output).
    case $name in
        generate) extra="-msimd128 -mllvm -disable-lsr" ;;
        *) extra= ;;
    esac
    # shellcheck disable=SC2086 # $extra is a list of flags, split on purpose
    "$cc" --target=wasm32-wasi -O2 $extra -Wall -Wextra -Werror \
        -ffile-prefix-map="$here"=. -fdebug-prefix-map="$here"=. \
        -Wl,--strip-all -o "$out/$name.wasm.tmp" "$src" -lm
    chmod 644 "$out/$name.wasm.tmp"
    mv "$out/$name.wasm.tmp" "$out/$name.wasm"
done
"$cc" --version | head -n 1 > "$out/TOOLCHAIN"
