"""Build of the one C extension, felixpy._rulehash (everything else is in pyproject.toml).

The extension is optional: where it cannot be built (no compiler, no Python or OpenSSL
headers), the package installs without it and hashes rules in Python (the same hashes,
slower; the daemon logs which it uses at start).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("felixpy._rulehash", ["felixpy/_rulehash.c"], libraries=["crypto"],
                             extra_compile_args=["-O2", "-Wall"], optional=True)])
