"""The daemon's steady-state imports stay lean (#17, memory: the import floor is part of peak RSS).

A fresh interpreter imports what the daemon imports for iptables mode; modules the daemon never uses
there must not be loaded: pyroute2's NDB/IPDB (and sqlite3 with them), bcc (compile worker only),
gRPC (that transport only), hypothesis (tests only), the nftables bindings.
"""

from __future__ import annotations

import json
import subprocess
import sys

DAEMON_IMPORTS = "import felixpy.daemon, felixpy.dataplane.wiring, felixpy.drivers.netlink.pyroute"
NOT_LOADED = ("sqlite3", "pyroute2.ndb", "pyroute2.ipdb", "pyroute2.nslink", "bcc", "grpc", "hypothesis",
              "nftables")


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
                         check=True, capture_output=True, text=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_daemon_imports_leave_unused_packages_unloaded() -> None:
    loaded = _loaded_after(DAEMON_IMPORTS)
    assert "pyroute2.iproute.linux" in loaded  # the probe does import the netlink driver
    assert sorted(m for m in NOT_LOADED if m in loaded) == []


def test_pyroute2_top_level_names_still_resolve() -> None:
    # Code outside the daemon (tests, tools) may still write `from pyroute2 import NDB`: the real
    # package __init__ then runs once, on demand.
    loaded = _loaded_after("import felixpy\nfrom pyroute2 import IPRoute, NDB\n"
                           "from pyroute2.iproute.linux import IPRoute as Linux\nassert IPRoute is Linux")
    assert "pyroute2.ndb" in loaded


def test_pyroute2_submodule_attribute_does_not_load_everything() -> None:
    loaded = _loaded_after("import felixpy, pyroute2\nassert pyroute2.config.__name__ == 'pyroute2.config'")
    assert "pyroute2.ndb" not in loaded
