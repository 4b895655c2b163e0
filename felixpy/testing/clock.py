"""The one fake clock: virtual time for every test, advanced by hand or by ``sleep``.

Shape: an object with ``monotonic()`` (the :class:`~felixpy.dataplane.clock.Clock`
protocol), not a bare callable.  The clock is injected as an object at the composition
roots — :class:`~felixpy.daemon.Daemon`, :class:`~felixpy.dataplane.core.InternalDataplane`,
:func:`~felixpy.dataplane.wiring.build`, the interface monitor — while the leaf consumers
(tables, IP sets, route tables, ``KernelDeps.clock``, health, heap trimmer, update filter)
take a ``Callable[[], float]``; tests hand those the bound method ``clock.monotonic``.  A
bound method fits both kinds of call site, a bare callable only the leaves (every root
would have had to change).  Drivers that also wait (the ipset, iptables and nftables
drivers take ``sleep=``) get ``clock.sleep``, which advances the same virtual time and
records each sleep in :attr:`FakeClock.sleeps`.
"""

from __future__ import annotations


class FakeClock:
    """Manually advanced monotonic time; :meth:`sleep` advances it too and is recorded."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
