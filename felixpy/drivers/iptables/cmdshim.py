"""Compatibility name for the shared command runner (:mod:`felixpy.drivers.cmdshim`).

Kept only because ``felixpy/dataplane/wiring.py`` imports ``RealRunner`` from
here; new code imports :class:`felixpy.drivers.cmdshim.SubprocessRunner`.
Remove once wiring does.
"""

from felixpy.drivers.cmdshim import SubprocessRunner as RealRunner

__all__ = ["RealRunner"]
