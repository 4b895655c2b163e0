"""Harness code shared by tests/, fv/ and bench/: namespaces, the daemon as a subprocess,
CNI-style topology, the connectivity checker, a node's kernel assembled from the drivers' fakes
(``kernel.py``, for building the real dataplane in-process), and the one fake clock.

Where fakes live: a fake sits in a ``fake.py`` beside the thing it fakes, so whoever changes a
driver sees the stand-in that has to keep up — ``drivers/iptables/fake.py`` (the save/restore
tools), ``drivers/ipsets/fake.py`` (``ipset``), ``drivers/nftables/fake.py`` (libnftables),
``drivers/netlink/fake.py`` (netlink), ``drivers/generictables/fake.py`` (the ``Table``
protocol, for manager tests), ``bpf/fake.py`` (BPF maps).  Fakes are stateful and transactional
like the real thing, so tests assert resulting state.  This package holds only what is not a
stand-in for one component: harnesses that set up and drive a whole environment, plus
:mod:`felixpy.testing.clock` (time is not a driver; every component takes it).
"""
