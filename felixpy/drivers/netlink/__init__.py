"""A narrow, typed netlink shim for the routing drivers.

* :mod:`.types` — frozen values (Link, Addr, Route, Rule, Neigh, FDBEntry...).
* :mod:`.api` — the :class:`~.api.Netlink` protocol drivers are written against.
* :mod:`.pyroute` — the real implementation (pyroute2, plus :mod:`.iproute2`:
  ``ip -batch`` for bulk route/neighbour writes and ``ip -j`` dumps).
* :mod:`.nsutil` — running a callable inside a named namespace (sockets, forks).
* :mod:`.fake` — a stateful fake kernel with failure flags, for unit tests.
* :mod:`.devices` — reconciling tunnel devices (VXLAN, IPIP, WireGuard).

``ip`` and ``conntrack`` run through the shared :mod:`felixpy.drivers.cmdshim`.
"""
