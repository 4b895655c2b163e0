"""Scenario feed: a human-written YAML file → the ``ToDataplane`` stream Felix would send.

A scenario stands in for Felix's calculation graph when developing or testing
the dataplane without a cluster.  This module owns the file format, its
validation, and the ordering of the resulting messages.  The full reference is
docs/scenario-format.md; in short::

    description: one node, two workloads          # optional, free text
    config: {InterfacePrefix: cali}               # ConfigUpdate.config
    ipsets:
      - {id: s:clients, type: net, members: [10.65.0.2/32]}
    policies:
      - name: allow-8080                          # kind gnp, tier default
        inbound:
          - {action: allow, protocol: tcp, dst_ports: [8080], src_ip_set_ids: [s:clients]}
    profiles:
      - {name: kns.default, inbound: [{action: allow}], outbound: [{action: allow}]}
    workloads:
      - name: cali-wl-a                           # host-side interface
        id: {workload: default/wl-a}              # orchestrator k8s, endpoint eth0
        ipv4_nets: [10.65.0.2/32]
        profile_ids: [kns.default]
        tiers: [{name: default, ingress: [allow-8080]}]
    steps:
      - after_seconds: 2
        update: {policies: [...], workloads: [...]}
        remove: {ipsets: [s:clients]}

Other sections: ``ipset_deltas``, ``host_endpoints``, ``routes``, ``vteps``,
``ipam_pools``, ``encapsulation``, ``host_metadata``, ``wireguard_endpoints``,
``wireguard_endpoints_v6``, ``namespaces``, ``service_accounts``,
``services``, ``global_bgp_config``.

Semantics:

* The initial batch always starts with a ``ConfigUpdate`` (Felix sends one at
  start of day) and ends with ``InSync``.  Each step is one later batch.
* Within a batch, messages follow Felix's ``EventSequencer`` flush order:
  config, IP sets, policies, profiles, endpoints, endpoint removes, …, IP set
  removes, …, routes after VTEPs (see :data:`FLUSH_ORDER`).  Referenced objects
  therefore arrive before their referrers and leave after them.
* Sequence numbers run from ``start_seq`` (default 0) across the initial batch
  and every step, +1 per message.
* References are checked against what the scenario has defined at that
  point: IP set ids in rules, policy names in tiers, profile ids in endpoints,
  and every ``remove:`` entry.  A step ``config`` is merged over the previous
  config and the full result is sent, as Felix does.
* Any problem raises :class:`ScenarioError` naming the YAML path, e.g.
  ``policies[2].inbound[0].dst_ports[0]: bad port 'x'``.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from google.protobuf.message import Message

from felixpy.feed.protofill import (
    ScenarioError,
    check_keys,
    describe,
    expect_list,
    expect_mapping,
    fields_of,
    fill,
    index_path,
    key_path,
    map_entry_fields,
    scalar,
)
from felixpy.feed.scenario_sections import SECTIONS, SECTIONS_BY_NAME, ScenarioState
from felixpy.messages import to_dataplane, to_field_for
from felixpy.proto import felixbackend_pb2 as pb

__all__ = [
    "FLUSH_ORDER",
    "Scenario",
    "ScenarioError",
    "Step",
    "bundled_scenario_path",
    "load_scenario",
    "parse_scenario",
    "scenario_from_dict",
]

FLUSH_ORDER: tuple[tuple[str, ...], ...] = (
    ("config_update",),
    ("ipset_update",),
    ("ipset_delta_update",),
    ("active_policy_update",),
    ("active_profile_update",),
    ("workload_endpoint_update", "host_endpoint_update"),
    ("workload_endpoint_remove", "host_endpoint_remove"),
    ("active_profile_remove",),
    ("active_policy_remove",),
    ("ipset_remove",),
    ("service_account_update", "service_account_remove"),
    ("namespace_update", "namespace_remove"),
    ("route_remove",),
    ("vtep_remove",),
    ("vtep_update",),
    ("route_update",),
    ("wireguard_endpoint_remove", "wireguard_endpoint_v6_remove"),
    ("wireguard_endpoint_update", "wireguard_endpoint_v6_update"),
    ("host_metadata_remove",),
    ("host_metadata_update",),
    ("ipam_pool_remove",),
    ("ipam_pool_update",),
    ("encapsulation",),
    ("global_bgp_config_update",),
    ("service_update", "service_remove"),
    ("in_sync",),
)
"""ToDataplane payload fields grouped by Felix's EventSequencer flush position."""

_RANK: Mapping[str, int] = {field: rank for rank, group in enumerate(FLUSH_ORDER) for field in group}
SECTION_NAMES: tuple[str, ...] = ("config", *(s.name for s in SECTIONS), "encapsulation", "global_bgp_config")
"""Every section a scenario (or a step's ``update``) may contain."""
_TOP_LEVEL_EXTRAS = ("description", "steps")
_STEP_KEYS = ("after_seconds", "description", "update", "remove")
_REMOVABLE = ("config",) + tuple(s.name for s in SECTIONS if s.remove is not None)


@dataclass(frozen=True, slots=True)
class Step:
    """A scripted follow-up batch, sent ``after_seconds`` after the previous one."""

    after_seconds: float
    messages: tuple[pb.ToDataplane, ...]
    description: str = ""


@dataclass(frozen=True, slots=True)
class Scenario:
    """The initial batch (ending with InSync) and the later steps."""

    initial: tuple[pb.ToDataplane, ...]
    steps: tuple[Step, ...]
    description: str = ""

    def all_messages(self) -> Iterator[pb.ToDataplane]:
        """Every message in send order (initial batch, then each step)."""
        yield from self.initial
        for step in self.steps:
            yield from step.messages

    @property
    def next_seq(self) -> int:
        """The sequence number a message sent after the scenario should carry."""
        last = list(self.all_messages())[-1]
        return int(last.sequence_number) + 1


# --------------------------------------------------------------------------
# Loading.
# --------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys instead of keeping the last."""


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    """Construct a mapping, refusing repeated keys (``<<:`` merges may be overridden)."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, Hashable):
            continue  # construct_mapping below reports unhashable keys
        if key in seen:
            mark = key_node.start_mark
            raise ScenarioError("", f"duplicate key {key!r} at line {mark.line + 1}, column {mark.column + 1}")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_scenario(text: str, start_seq: int = 0, source: str = "<scenario>") -> Scenario:
    """Parse scenario YAML text."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ScenarioError("", f"{source}: invalid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        data = {}
    return scenario_from_dict(data, start_seq)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """``problem at line L, column C`` when PyYAML knows where, else its message."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        context = f" ({exc.context})" if exc.context else ""
        return f"{exc.problem}{context} at line {mark.line + 1}, column {mark.column + 1}"
    return str(exc)


def load_scenario(path: str | Path, start_seq: int = 0) -> Scenario:
    """Read and parse a scenario file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError("", f"cannot read scenario {file}: {exc.strerror}") from None
    return parse_scenario(text, start_seq, source=str(file))


def bundled_scenario_path(name: str = "demo") -> Path:
    """Path of a scenario shipped in ``felixpy/feed/scenarios/`` (e.g. ``demo``)."""
    resource = importlib.resources.files("felixpy.feed").joinpath("scenarios", f"{name}.yaml")
    path = Path(str(resource))
    if not path.is_file():
        raise ScenarioError("", f"no bundled scenario named {name!r}")
    return path


# --------------------------------------------------------------------------
# Building batches.
# --------------------------------------------------------------------------


def scenario_from_dict(data: Any, start_seq: int = 0) -> Scenario:
    """Build a scenario from already-parsed YAML (a mapping)."""
    if isinstance(start_seq, bool) or not isinstance(start_seq, int) or start_seq < 0:
        raise ScenarioError("", f"bad start_seq {describe(start_seq)}")
    top = expect_mapping(data, "")
    check_keys(top, SECTION_NAMES + _TOP_LEVEL_EXTRAS, "")
    description = _description(top, "")
    sections = {k: v for k, v in top.items() if k not in _TOP_LEVEL_EXTRAS}
    state = ScenarioState()
    initial = _build_batch(sections, {}, state, "", "", initial=True)
    initial.append(pb.InSync())
    seq = start_seq
    initial_msgs, seq = _number(initial, seq)
    steps = []
    for i, raw in enumerate(expect_list(top.get("steps") or [], "steps")):
        step, seq = _build_step(raw, index_path("steps", i), state, seq)
        steps.append(step)
    return Scenario(initial=initial_msgs, steps=tuple(steps), description=description)


def _description(data: Mapping[str, Any], path: str) -> str:
    value = data.get("description", "")
    if not isinstance(value, str):
        raise ScenarioError(key_path(path, "description"), f"expected text, got {describe(value)}")
    return value


def _number(payloads: list[Message], seq: int) -> tuple[tuple[pb.ToDataplane, ...], int]:
    """Sort payloads into flush order (stable) and wrap them with sequence numbers."""
    ordered = sorted(payloads, key=lambda m: _RANK[to_field_for(m)])
    return tuple(to_dataplane(seq + i, m) for i, m in enumerate(ordered)), seq + len(ordered)


def _build_step(raw: Any, path: str, state: ScenarioState, seq: int) -> tuple[Step, int]:
    data = expect_mapping(raw, path)
    check_keys(data, _STEP_KEYS, path)
    delay = data.get("after_seconds", 0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise ScenarioError(key_path(path, "after_seconds"), f"expected a number >= 0, got {describe(delay)}")
    update = expect_mapping(data.get("update") or {}, key_path(path, "update"))
    remove = expect_mapping(data.get("remove") or {}, key_path(path, "remove"))
    check_keys(update, SECTION_NAMES, key_path(path, "update"))
    check_keys(remove, _REMOVABLE, key_path(path, "remove"))
    payloads = _build_batch(update, remove, state, key_path(path, "update"), key_path(path, "remove"), initial=False)
    if not payloads:
        raise ScenarioError(path, "a step needs an update or a remove")
    messages, seq = _number(payloads, seq)
    return Step(after_seconds=float(delay), messages=messages, description=_description(data, path)), seq


def _build_batch(
    update: Mapping[str, Any],
    remove: Mapping[str, Any],
    state: ScenarioState,
    update_path: str,
    remove_path: str,
    *,
    initial: bool,
) -> list[Message]:
    """Apply one batch's removes, then its updates, to ``state``; return payloads."""
    removed: dict[tuple[str, Hashable], str] = {}
    payloads: list[Message] = []
    for section in SECTIONS:
        if section.name in remove:
            payloads += _apply_removes(
                section.name, remove[section.name], state, key_path(remove_path, section.name), removed
            )
    config_changed = _update_config(update, remove, state, update_path, remove_path)
    if initial or config_changed:
        payloads.append(pb.ConfigUpdate(config=state.config))
    for section in SECTIONS:
        if section.name in update:
            path = key_path(update_path, section.name)
            payloads += _apply_updates(section.name, update[section.name], state, path, removed)
    payloads += _single_sections(update, update_path)
    return payloads


def _apply_removes(
    name: str, refs: Any, state: ScenarioState, path: str, removed: dict[tuple[str, Hashable], str]
) -> list[Message]:
    section = SECTIONS_BY_NAME[name]
    assert section.remove is not None  # guarded by check_keys(_REMOVABLE)
    payloads = []
    for i, ref in enumerate(expect_list(refs or [], path)):
        item_path = index_path(path, i)
        key, msg = section.remove(ref, item_path, state)
        if (name, key) in removed:
            raise ScenarioError(
                item_path, f"{section.noun} {describe(ref)} is already removed at {removed[(name, key)]}"
            )
        removed[(name, key)] = item_path
        payloads.append(msg)
    for section_name, key in removed:
        if section_name == name:
            state.of(name).pop(key, None)
    return payloads


def _apply_updates(
    name: str, items: Any, state: ScenarioState, path: str, removed: Mapping[tuple[str, Hashable], str]
) -> list[Message]:
    section = SECTIONS_BY_NAME[name]
    seen: dict[Hashable, str] = {}
    payloads = []
    for i, item in enumerate(expect_list(items or [], path)):
        item_path = index_path(path, i)
        key, msg = section.parse(expect_mapping(item, item_path), item_path, state)
        if key in seen:
            raise ScenarioError(item_path, f"duplicate {section.noun} {describe(key)} (also at {seen[key]})")
        if (name, key) in removed:
            raise ScenarioError(item_path, f"{section.noun} {describe(key)} is also removed at {removed[(name, key)]}")
        seen[key] = item_path
        if name != "ipset_deltas":
            state.of(name)[key] = msg
        payloads.append(msg)
    return payloads


def _update_config(
    update: Mapping[str, Any], remove: Mapping[str, Any], state: ScenarioState, update_path: str, remove_path: str
) -> bool:
    """Merge ``config`` updates into ``state.config`` and drop removed keys."""
    changed = False
    if "config" in remove:
        path = key_path(remove_path, "config")
        for i, key in enumerate(expect_list(remove["config"], path)):
            if not isinstance(key, str) or key not in state.config:
                raise ScenarioError(index_path(path, i), f"unknown config key {describe(key)}")
            del state.config[key]
            changed = True
    if "config" in update:
        path = key_path(update_path, "config")
        _, value_fd = map_entry_fields(fields_of(pb.ConfigUpdate)["config"])
        for key, value in expect_mapping(update["config"] or {}, path).items():
            state.config[key] = scalar(value_fd, value, key_path(path, key), lenient_str=True)
        changed = True
    return changed


def _single_sections(update: Mapping[str, Any], path: str) -> list[Message]:
    """``encapsulation`` and ``global_bgp_config``: one mapping each, sent as given."""
    payloads: list[Message] = []
    for name, message in (("encapsulation", pb.Encapsulation), ("global_bgp_config", pb.GlobalBGPConfigUpdate)):
        if name in update:
            msg = message()
            fill(msg, expect_mapping(update[name] or {}, key_path(path, name)), key_path(path, name))
            payloads.append(msg)
    return payloads
