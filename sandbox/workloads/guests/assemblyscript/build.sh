#!/bin/sh
# Builds wc.ts into OUT_DIR/wc.wasm (default: this directory) with the AssemblyScript compiler and its
# WASI shim from npm; their versions go to OUT_DIR/TOOLCHAIN. AS_PREFIX is the npm prefix they are
# installed under (default: this directory):
#   cp package.json package-lock.json DIR && npm ci --prefix DIR   (the pinned versions)
# Needs node (Debian 12: nodejs). Deterministic: no source map, no debug names.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mkdir -p "$out"
out=$(cd "$out" && pwd)
prefix=$(cd "${AS_PREFIX:-$here}" && pwd)
modules="$prefix/node_modules"
version() { node -p "require('$modules/$1/package.json').version"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# asc reads the shim's config relative to the directory it runs in (an absolute --config loses
# the shim's library), so it runs from the npm prefix; the source name never reaches the module.
cd "$prefix"
node node_modules/assemblyscript/bin/asc.js "$here/wc.ts" \
    --config node_modules/@assemblyscript/wasi-shim/asconfig.json -O3 --noAssert --outFile "$tmp/wc.wasm"
chmod 644 "$tmp/wc.wasm"
mv "$tmp/wc.wasm" "$out/wc.wasm"
echo "assemblyscript $(version assemblyscript) @assemblyscript/wasi-shim $(version @assemblyscript/wasi-shim) binaryen $(version binaryen)" \
    > "$out/TOOLCHAIN"
