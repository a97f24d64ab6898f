#!/bin/sh
# Builds wc.zig into OUT_DIR/wc.wasm (default: this directory); Zig's version goes to OUT_DIR/TOOLCHAIN.
# Zig comes from PyPI: `pip install ziglang==0.13.0` gives `python3 -m ziglang`. Set ZIG to the
# command that runs it (default: `zig` if on PATH, else `python3 -m ziglang`). Deterministic:
# ReleaseSmall, stripped, and the caches live in a temporary directory (nothing lands in the tree).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -z "${ZIG:-}" ]; then
    if command -v zig >/dev/null 2>&1; then ZIG=zig; else ZIG="python3 -m ziglang"; fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export ZIG_GLOBAL_CACHE_DIR="$tmp/global" ZIG_LOCAL_CACHE_DIR="$tmp/local"
cd "$here"
$ZIG build-exe -target wasm32-wasi -O ReleaseSmall -fstrip --name wc -femit-bin="$tmp/wc.wasm" wc.zig
chmod 644 "$tmp/wc.wasm"
mv "$tmp/wc.wasm" "$out/wc.wasm"
echo "zig $($ZIG version)" > "$out/TOOLCHAIN"
