"""The one fake clock: virtual time for every test, advanced by hand or by ``sleep``.

Shape: an object with ``monotonic()`` (the :class:`~felixpy.dataplane.clock.Clock`
protocol), not a bare callable.  The clock is injected once at the composition roots —
:class:`~felixpy.daemon.Daemon`, :class:`~felixpy.dataplane.core.InternalDataplane`,
:func:`~felixpy.dataplane.wiring.build_dataplane`, the interface monitor — which take a
``Clock`` and hand the bound method ``clock.monotonic`` down to the leaf consumers (tables,
IP sets, route tables, health, heap trimmer, update filter) that take a
``Callable[[], float]``.  A bound method fits both kinds of call site; a bare callable fits
only the leaves, so every root would have to change.  Drivers that also wait (the ipset and
iptables drivers take ``sleep=``) get ``clock.sleep``, which advances the same virtual time.
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
