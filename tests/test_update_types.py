"""Managers' declarations, checked against their source: ``update_types`` (the loop hands a manager
only the types it declares) and ``writes_ip_sets`` (it programs before the IP-set write starts).

A declaration that left out a type its ``on_update`` acts on would silently drop those messages, so each
one is checked against the source: the message types named in ``isinstance`` checks in ``on_update`` and
in every method of the class it calls (transitively) must be exactly the declared ones, and such an
``on_update`` must not hand the message to another object's ``on_update`` (whose checks this cannot see).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.message import Message

import felixpy.managers
from felixpy.config import Config
from felixpy.dataplane.core import InternalDataplane
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceState, IfaceStateUpdate
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.clock import FakeClock


def classes_defining(attr: str) -> list[type]:
    """The classes of ``felixpy.managers`` that define *attr* themselves."""
    out = []
    for info in pkgutil.iter_modules(felixpy.managers.__path__):
        mod = importlib.import_module(f"felixpy.managers.{info.name}")
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ == mod.__name__ and attr in vars(cls):
                out.append(cls)
    return out


def reachable_calls(cls: type, entry: str) -> Iterator[ast.Call]:
    """Every call in *entry* and in the methods of *cls* it calls on ``self``, transitively."""
    seen: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        if name in seen or name not in vars(cls):
            continue
        seen.add(name)
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(vars(cls)[name])))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
                todo.append(func.attr)
            yield node


def _is_message_type(obj: object) -> bool:
    return isinstance(obj, type) and (issubclass(obj, Message) or obj in (IfaceStateUpdate, IfaceAddrsUpdate))


def checked_types(cls: type) -> tuple[set[type], list[str]]:
    """(message types named in isinstance checks reachable from on_update, delegations found)."""
    module = importlib.import_module(cls.__module__)
    found: set[type] = set()
    delegations: list[str] = []
    for node in reachable_calls(cls, "on_update"):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "isinstance":
            arg = node.args[1]
            for e in (arg.elts if isinstance(arg, ast.Tuple) else [arg]):
                obj = eval(ast.unparse(e), vars(module))  # noqa: S307 - our own source
                if _is_message_type(obj):
                    found.add(obj)
        elif isinstance(func, ast.Attribute) and func.attr == "on_update" and \
                not (isinstance(func.value, ast.Name) and func.value.id == "self"):
            delegations.append(ast.unparse(node))
    return found, delegations


CLASSES = classes_defining("update_types")


def test_the_flood_path_managers_declare() -> None:
    names = {c.__name__ for c in CLASSES}
    assert {"EndpointManager", "HostEndpointManager", "PolicyManager", "IPSetsManager", "DSCPManager",
            "FloatingIPManager"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_declared_types_are_exactly_what_on_update_checks(cls: type) -> None:
    found, delegations = checked_types(cls)
    declared: tuple[type, ...] = vars(cls)["update_types"]
    assert not delegations, f"{cls.__name__}.on_update hands messages on: {delegations}"
    assert set(declared) == found, (sorted(t.__name__ for t in found), sorted(t.__name__ for t in declared))


class Recorder:
    def __init__(self, types: tuple[type, ...] | None) -> None:
        if types is not None:
            self.update_types = types
        self.got: list[str] = []

    def on_update(self, msg: Any) -> None:
        self.got.append(type(msg).__name__)

    def complete_deferred_work(self) -> None:
        pass


def test_the_loop_routes_by_declared_type_in_manager_order() -> None:
    dp = InternalDataplane(Config(), FakeClock())
    everything, ipsets_only, nothing = Recorder(None), Recorder((pb.IPSetUpdate, pb.IPSetRemove)), Recorder(())
    for m in (everything, ipsets_only, nothing):
        dp.register_manager(m)
    dp.on_datastore_message(pb.IPSetUpdate(id="s:a", type=pb.IPSetUpdate.IP))
    dp.on_datastore_message(pb.ConfigUpdate())
    dp.on_iface_update(IfaceStateUpdate("eth0", IfaceState.UP, 2))
    late = Recorder((pb.IPSetRemove, IfaceStateUpdate))
    dp.register_manager(late)  # registered after routes were worked out: they are worked out again
    dp.on_datastore_message(pb.IPSetRemove(id="s:a"))
    dp.on_iface_update(IfaceStateUpdate("eth0", IfaceState.DOWN, 2))
    assert everything.got == ["IPSetUpdate", "ConfigUpdate", "IfaceStateUpdate", "IPSetRemove", "IfaceStateUpdate"]
    assert ipsets_only.got == ["IPSetUpdate", "IPSetRemove"]
    assert nothing.got == []
    assert late.got == ["IPSetRemove", "IfaceStateUpdate"]


# --------------------------------------------------------------------- writes_ip_sets
# The update methods of IPSetsDataplane, and IPSetFilter.set_filter (which also changes what it is to hold).
IPSET_RECORDERS = {"add_or_replace_ip_set", "add_members", "remove_members", "remove_ip_set", "set_filter"}


def records_ip_sets_when_programming(cls: type, entry: str = "complete_deferred_work") -> bool:
    """Whether *entry* (or a method of the class it calls, transitively) calls an IP-set dataplane's
    recording methods."""
    return any(isinstance(node.func, ast.Attribute) and node.func.attr in IPSET_RECORDERS
               for node in reachable_calls(cls, entry))


MANAGERS = classes_defining("complete_deferred_work")


def test_the_ip_set_writers_are_found() -> None:
    writers = {c.__name__ for c in MANAGERS if records_ip_sets_when_programming(c)}
    assert {"IPSetsManager", "HostIPManager", "MasqManager", "DSCPManager", "VXLANManager",
            "RawEgressPolicyManager"} <= writers


@pytest.mark.parametrize("cls", MANAGERS, ids=lambda c: c.__name__)
def test_writes_ip_sets_is_declared_exactly_by_the_managers_that_do(cls: type) -> None:
    """The loop starts the IP-set write once the declaring managers have programmed and renders the rest
    beside it (felixpy/dataplane/core.py): an undeclared writer would race the write, a needless
    declaration only delays it."""
    assert bool(getattr(cls, "writes_ip_sets", False)) == records_ip_sets_when_programming(cls), cls.__name__


@pytest.mark.parametrize("cls", MANAGERS, ids=lambda c: c.__name__)
def test_no_manager_records_ip_sets_after_the_devices(cls: type) -> None:
    """The IP-set write is joined only after the devices, FDB and routes steps: ``on_devices_applied``
    recording a set would race it."""
    assert not records_ip_sets_when_programming(cls, "on_devices_applied"), cls.__name__
