"""Build shim: cffi's `cffi_modules` keyword has no pyproject.toml spelling yet.

Everything else about the package lives in pyproject.toml.
"""
from setuptools import setup

setup(cffi_modules=["native/build_native.py:ffibuilder"])
