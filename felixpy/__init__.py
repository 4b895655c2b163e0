"""felixpy: a Python port of Calico Felix's Linux dataplane.

See docs/architecture.md for what each sub-package owns and how data flows.
"""

__version__ = "0.1.0"

from felixpy import _leanimports

_leanimports.install()
