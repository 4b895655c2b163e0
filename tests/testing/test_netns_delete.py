"""The throwaway namespaces of tests, FV and benchmarks are really gone after delete().

run-tests fails a run that leaves an ``fpy*`` namespace behind; these tests pin down the
two ways one used to stay silently: a name mounted twice (``ip netns del`` then fails with
EBUSY and used to be ignored) and one failing namespace stopping a node's others."""

from __future__ import annotations

import os
import subprocess

import pytest

from felixpy.testing import netns as nsmod
from felixpy.testing.topology import Node

pytestmark = pytest.mark.kernel


def _mount_again(name: str) -> None:
    path = f"/run/netns/{name}"
    subprocess.run(["mount", "--bind", path, path], check=True)


def test_a_name_mounted_twice_is_deleted() -> None:
    name = nsmod.create("fpyt")
    try:
        _mount_again(name)
        # iproute2 alone peels one mount and fails to unlink the name.
        assert subprocess.run(["ip", "netns", "del", name], capture_output=True).returncode != 0
        assert os.path.exists(f"/run/netns/{name}")
        _mount_again(name)
        nsmod.delete(name)
        assert not os.path.exists(f"/run/netns/{name}")
    finally:
        for _ in range(4):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_a_name_that_cannot_go_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    name = nsmod.create("fpyt")
    real_run = subprocess.run

    def no_del(args, *a, **kw):  # type: ignore[no-untyped-def]
        if list(args[:3]) == ["ip", "netns", "del"]:
            return subprocess.CompletedProcess(args, 1, "", "Cannot remove namespace file: busy")
        return real_run(args, *a, **kw)

    try:
        monkeypatch.setattr(nsmod.subprocess, "run", no_del)
        with pytest.raises(RuntimeError, match=f"{name} could not be deleted.*busy"):
            nsmod.delete(name, attempts=2)
    finally:
        monkeypatch.undo()
        nsmod.delete(name)
    assert not os.path.exists(f"/run/netns/{name}")


def test_a_node_deletes_its_other_namespaces_when_one_cannot_go(monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node.create("fpyt", workload_prefix="fpytw")
    a = node.add_workload("a", "10.65.0.2", "fd00::2", iface="cali-a")
    b = node.add_workload("b", "10.65.0.3", "fd00::3", iface="cali-b")
    stuck = a.netns
    real_run = subprocess.run

    def stuck_del(args, *a, **kw):  # type: ignore[no-untyped-def]
        if list(args) == ["ip", "netns", "del", stuck]:
            return subprocess.CompletedProcess(args, 1, "", "Device or resource busy")
        return real_run(args, *a, **kw)

    try:
        monkeypatch.setattr(nsmod.subprocess, "run", stuck_del)
        with pytest.raises(RuntimeError, match=stuck):
            node.delete()
        monkeypatch.undo()
        assert not os.path.exists(f"/run/netns/{b.netns}")
        assert not os.path.exists(f"/run/netns/{node.netns}")
        assert os.path.exists(f"/run/netns/{stuck}")
    finally:
        monkeypatch.undo()
        nsmod.delete(stuck)
    assert not os.path.exists(f"/run/netns/{stuck}")
