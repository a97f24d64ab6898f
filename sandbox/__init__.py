"""e31 sandbox: runs one WebAssembly/WASI module under limits, deterministically.

Synchronous, and the only package that imports wasmtime. Never imports trio or e31.node.
"""
