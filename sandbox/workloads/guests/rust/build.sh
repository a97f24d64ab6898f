#!/bin/sh
# Builds wc.rs into OUT_DIR/wc.wasm (default: this directory) with rustc alone (no cargo, no crates);
# rustc's version line goes to OUT_DIR/TOOLCHAIN. The target is wasm32-wasi, which rustc 1.78 and
# later call wasm32-wasip1. Deterministic: one codegen unit, the build path remapped, symbols stripped.
# Needs (Debian 12): rustc libstd-rust-dev-wasm32 (rustc 1.63). Override the compiler with RUSTC=...
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rustc=${RUSTC:-rustc}
target=wasm32-wasi
if "$rustc" --print target-list | grep -qx wasm32-wasip1; then
    target=wasm32-wasip1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$here"
"$rustc" --edition 2021 --target "$target" -C opt-level=2 -C codegen-units=1 -C strip=symbols \
    --remap-path-prefix "$here"=. -o "$tmp/wc.wasm" wc.rs
chmod 644 "$tmp/wc.wasm"
mv "$tmp/wc.wasm" "$out/wc.wasm"
"$rustc" --version | head -n 1 > "$out/TOOLCHAIN"
