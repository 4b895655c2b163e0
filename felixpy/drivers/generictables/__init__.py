"""Backend-neutral *tables model: typed rules and chains, the Table protocol, rule hashing.

Nothing here renders text: the iptables and nftables backends alone turn these
values into their own syntax.  See :mod:`.model` and :mod:`.table`.
"""

from felixpy.drivers.generictables.model import *  # noqa: F401,F403
from felixpy.drivers.generictables.table import MapMetadata, MapsDataplane, Table  # noqa: F401
