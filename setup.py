"""Builds the optional C record decoder; everything else about the package is in pyproject.toml.

`optional=True`: without a working C compiler (or Python headers) setuptools prints a warning and
installs the package without it, and e31.protocol decodes records in pure Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("e31.protocol._recdecode", sources=["protocol/_recdecode.c"], optional=True)])
