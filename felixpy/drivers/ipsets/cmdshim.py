"""Compatibility name for the shared command runner (:mod:`felixpy.drivers.cmdshim`).

Kept only because ``felixpy/dataplane/wiring.py`` imports ``SubprocessRunner``
from here; new code imports it from :mod:`felixpy.drivers.cmdshim`.  Remove
once wiring does.
"""

from felixpy.drivers.cmdshim import SubprocessRunner

__all__ = ["SubprocessRunner"]
