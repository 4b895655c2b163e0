"""Felix dataplane API: wire round trips, field numbers, envelope helpers, codegen."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from felixpy import messages
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.proto import felixpy_pb2

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------
# A filler that sets every field to a non-default value.
# --------------------------------------------------------------------------


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _chosen_oneof_members(desc: Descriptor, variant: int) -> set[str]:
    """For each oneof, the one member this variant sets (first or last)."""
    return {oneof.fields[variant].name for oneof in desc.oneofs}


def _scalar(fd: FieldDescriptor) -> Any:
    if fd.type == FieldDescriptor.TYPE_STRING:
        return f"{fd.name}-value"
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return True
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return fd.enum_type.values[-1].number
    if fd.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return 1.5
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return b"\x01\x02"
    return fd.number + 1000  # every integer type we use accepts this


def fill_all(msg: Message, variant: int = 0, depth: int = 0) -> Message:
    """Set every field of ``msg`` (one member per oneof) to non-default values."""
    assert depth < 10, "unexpected recursion in felixbackend.proto"
    desc = msg.DESCRIPTOR
    chosen = _chosen_oneof_members(desc, variant)
    expected = 0
    for fd in desc.fields:
        if fd.containing_oneof is not None and fd.name not in chosen:
            continue
        expected += 1
        _fill_field(msg, fd, variant, depth)
    assert len(msg.ListFields()) == expected, f"{desc.full_name}: not every field set"
    return msg


def _fill_field(msg: Message, fd: FieldDescriptor, variant: int, depth: int) -> None:
    if _is_map(fd):
        key_fd, value_fd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
        container = getattr(msg, fd.name)
        for key in (_scalar(key_fd), "k2" if key_fd.type == FieldDescriptor.TYPE_STRING else 2):
            if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                fill_all(container[key], variant, depth + 1)
            else:
                container[key] = _scalar(value_fd)
    elif fd.is_repeated and fd.type == FieldDescriptor.TYPE_MESSAGE:
        for _ in range(2):
            fill_all(getattr(msg, fd.name).add(), variant, depth + 1)
    elif fd.is_repeated:
        getattr(msg, fd.name).extend([_scalar(fd), _scalar(fd)])
    elif fd.type == FieldDescriptor.TYPE_MESSAGE:
        sub = getattr(msg, fd.name)
        sub.SetInParent()
        fill_all(sub, variant, depth + 1)
    else:
        setattr(msg, fd.name, _scalar(fd))


def _payload_fields(envelope: type[Message]) -> list[FieldDescriptor]:
    return list(envelope.DESCRIPTOR.oneofs_by_name["payload"].fields)


TO_FIELDS = _payload_fields(pb.ToDataplane)
FROM_FIELDS = _payload_fields(pb.FromDataplane)

# --------------------------------------------------------------------------
# Round trips.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("variant", [0, -1], ids=["first-oneof-member", "last-oneof-member"])
@pytest.mark.parametrize("fd", TO_FIELDS, ids=lambda fd: fd.name)
def test_every_to_dataplane_payload_round_trips(fd: FieldDescriptor, variant: int) -> None:
    envelope = pb.ToDataplane(sequence_number=2**40 + 7)
    payload = getattr(envelope, fd.name)
    payload.SetInParent()
    fill_all(payload, variant)
    wire = envelope.SerializeToString()

    decoded = pb.ToDataplane.FromString(wire)

    assert decoded == envelope
    assert decoded.WhichOneof("payload") == fd.name
    assert decoded.sequence_number == 2**40 + 7
    assert decoded.SerializeToString(deterministic=True) == envelope.SerializeToString(deterministic=True)


@pytest.mark.parametrize("variant", [0, -1], ids=["first-oneof-member", "last-oneof-member"])
@pytest.mark.parametrize("fd", FROM_FIELDS, ids=lambda fd: fd.name)
def test_every_from_dataplane_payload_round_trips(fd: FieldDescriptor, variant: int) -> None:
    envelope = pb.FromDataplane(sequence_number=99)
    getattr(envelope, fd.name).SetInParent()
    fill_all(getattr(envelope, fd.name), variant)

    decoded = pb.FromDataplane.FromString(envelope.SerializeToString())

    assert decoded == envelope
    assert decoded.WhichOneof("payload") == fd.name


@pytest.mark.parametrize(
    "message",
    [pb.SyncRequest, pb.DataplaneStats, pb.ReportResult, felixpy_pb2.ToDataplaneBatch, felixpy_pb2.FromDataplaneBatch],
    ids=lambda m: m.DESCRIPTOR.full_name,
)
def test_service_messages_round_trip(message: type[Message]) -> None:
    msg = fill_all(message())
    assert message.FromString(msg.SerializeToString()) == msg


def test_payload_lists_are_complete() -> None:
    assert [fd.name for fd in TO_FIELDS] == list(messages.PAYLOAD_FIELDS)
    assert [fd.name for fd in FROM_FIELDS] == list(messages.FROM_PAYLOAD_FIELDS)
    assert len(TO_FIELDS) == 33
    assert len(FROM_FIELDS) == 7


def test_every_payload_type_is_carried_by_exactly_one_field() -> None:
    for fields in (TO_FIELDS, FROM_FIELDS):
        types = [fd.message_type.full_name for fd in fields]
        assert len(types) == len(set(types))


# --------------------------------------------------------------------------
# Field numbers and types against Felix (reference §1).
# --------------------------------------------------------------------------

EXPECTED_NUMBERS = [
    ("ToDataplane", "sequence_number", 15),
    ("ToDataplane", "in_sync", 1),
    ("ToDataplane", "ipset_update", 2),
    ("ToDataplane", "workload_endpoint_update", 11),
    ("ToDataplane", "config_update", 13),
    ("ToDataplane", "host_metadata_update", 14),
    ("ToDataplane", "ipam_pool_update", 16),
    ("ToDataplane", "host_metadata_remove", 18),
    ("ToDataplane", "route_update", 23),
    ("ToDataplane", "vtep_update", 25),
    ("ToDataplane", "encapsulation", 30),
    ("ToDataplane", "wireguard_endpoint_v6_remove", 34),
    ("FromDataplane", "sequence_number", 8),
    ("FromDataplane", "process_status_update", 3),
    ("FromDataplane", "wireguard_status_update", 9),
    ("FromDataplane", "dataplane_in_sync", 10),
    ("Rule", "action", 1),
    ("Rule", "dst_ip_port_set_ids", 15),
    ("Rule", "not_protocol", 102),
    ("Rule", "not_icmp_type_code", 108),
    ("Rule", "not_dst_named_port_ip_set_ids", 113),
    ("Rule", "original_dst_service", 130),
    ("Rule", "original_src_service_namespace", 133),
    ("Rule", "metadata", 123),
    ("Rule", "rule_id", 201),
    ("PolicyID", "name", 2),
    ("PolicyID", "kind", 4),
    ("Policy", "namespace", 5),
    ("Policy", "tier", 8),
    ("WorkloadEndpointID", "orchestrator_id", 2),
    ("WorkloadEndpointUpdate", "endpoint", 5),
    ("WorkloadEndpoint", "ipv6_nets", 6),
    ("WorkloadEndpoint", "allow_spoofed_source_prefixes", 10),
    ("WorkloadEndpoint", "live_migration_vmi_name", 19),
    ("HostEndpointUpdate", "endpoint", 3),
    ("HostEndpoint", "forward_tiers", 8),
    ("TierInfo", "default_action", 4),
    ("RouteUpdate", "types", 12),
    ("RouteUpdate", "tunnel_type", 10),
    ("RouteUpdate", "borrowed", 11),
    ("RouteRemove", "dst", 2),
    ("QoSControls", "EgressPacketBurst", 14),
    ("ConfigUpdate", "source_to_raw_config", 2),
    ("WireguardStatusUpdate", "ip_version", 2),
    ("WorkloadEndpointStatusUpdate", "endpoint", 3),
]


@pytest.mark.parametrize(("message", "field", "number"), EXPECTED_NUMBERS)
def test_field_numbers_match_felix(message: str, field: str, number: int) -> None:
    assert getattr(pb, message).DESCRIPTOR.fields_by_name[field].number == number


# Every field, with its number and type, of the messages most at risk of drifting from Felix: the
# policy-sync report (rarely exercised, and where ``RuleTrace.none`` once had the wrong type), the
# status messages we send, and the envelopes.  A field added, dropped, renumbered or retyped in one of
# these messages fails ``test_at_risk_messages_match_felix_exactly``.
# Type spelling: proto scalar name, or the message/enum name relative to the package; "repeated " prefix.
AT_RISK_FIELDS: dict[str, list[tuple[str, int, str]]] = {
    "DataplaneStats": [
        ("src_ip", 1, "string"), ("dst_ip", 2, "string"), ("src_port", 3, "int32"), ("dst_port", 4, "int32"),
        ("protocol", 5, "Protocol"), ("stats", 6, "repeated Statistic"), ("rules", 7, "repeated RuleTrace"),
        ("action", 8, "Action"),
    ],
    "Statistic": [
        ("direction", 1, "Statistic.Direction"), ("relativity", 2, "Statistic.Relativity"),
        ("kind", 3, "Statistic.Kind"), ("action", 4, "Action"), ("value", 5, "int64"),
    ],
    "RuleTrace": [
        ("policy", 1, "PolicyID"), ("profile", 2, "ProfileID"), ("none", 3, "bool"),
        ("direction", 4, "RuleTrace.Direction"), ("rule_num", 5, "int32"),
    ],
    "ReportResult": [("successful", 1, "bool")],
    "ProcessStatusUpdate": [("iso_timestamp", 1, "string"), ("uptime", 2, "double")],
    "EndpointStatus": [("status", 1, "string")],
    "HostEndpointStatusUpdate": [("id", 1, "HostEndpointID"), ("status", 2, "EndpointStatus")],
    "HostEndpointStatusRemove": [("id", 1, "HostEndpointID")],
    "WorkloadEndpointStatusRemove": [("id", 1, "WorkloadEndpointID")],
    "IPSetUpdate": [("id", 1, "string"), ("members", 2, "repeated string"), ("type", 3, "IPSetUpdate.IPSetType")],
    "IPSetDeltaUpdate": [("id", 1, "string"), ("added_members", 2, "repeated string"),
                         ("removed_members", 3, "repeated string")],
    "IPSetRemove": [("id", 1, "string")],
    "Encapsulation": [("ipip_enabled", 1, "bool"), ("vxlan_enabled", 2, "bool"), ("vxlan_enabled_v6", 3, "bool"),
                      ("no_encap_enabled", 4, "bool")],
}

_SCALARS = {getattr(FieldDescriptor, n): n[len("TYPE_"):].lower() for n in dir(FieldDescriptor)
            if n.startswith("TYPE_") and n not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")}


def _type_spelling(fd: FieldDescriptor) -> str:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        name = fd.message_type.full_name
    elif fd.type == FieldDescriptor.TYPE_ENUM:
        name = fd.enum_type.full_name
    else:
        name = _SCALARS[fd.type]
    name = name.removeprefix(pb.DESCRIPTOR.package + ".")
    return f"repeated {name}" if fd.is_repeated else name


def test_type_spelling_tells_types_apart() -> None:
    rt = pb.RuleTrace.DESCRIPTOR.fields_by_name
    assert [_type_spelling(rt[n]) for n in ("policy", "none", "direction", "rule_num")] == \
        ["PolicyID", "bool", "RuleTrace.Direction", "int32"]
    assert _type_spelling(pb.DataplaneStats.DESCRIPTOR.fields_by_name["stats"]) == "repeated Statistic"


@pytest.mark.parametrize("message", sorted(AT_RISK_FIELDS))
def test_at_risk_messages_match_felix_exactly(message: str) -> None:
    actual = sorted((fd.name, fd.number, _type_spelling(fd)) for fd in getattr(pb, message).DESCRIPTOR.fields)
    assert actual == sorted(AT_RISK_FIELDS[message])


def test_rule_trace_none_is_a_flag_in_the_id_oneof() -> None:
    trace = pb.RuleTrace(none=True, direction=pb.RuleTrace.OUTBOUND)
    assert trace.WhichOneof("id") == "none"
    decoded = pb.RuleTrace.FromString(trace.SerializeToString())
    assert decoded.none is True and decoded.WhichOneof("id") == "none"


def test_key_field_types() -> None:
    fields = pb.ToDataplane.DESCRIPTOR.fields_by_name
    assert fields["sequence_number"].type == FieldDescriptor.TYPE_UINT64
    assert pb.FromDataplane.DESCRIPTOR.fields_by_name["sequence_number"].type == FieldDescriptor.TYPE_UINT64
    tier = pb.TierInfo.DESCRIPTOR.fields_by_name["ingress_policies"]
    assert tier.is_repeated and tier.message_type.full_name == "felix.PolicyID"
    assert pb.RouteUpdate.DESCRIPTOR.fields_by_name["types"].enum_type.full_name == "felix.RouteType"
    config = pb.ConfigUpdate.DESCRIPTOR.fields_by_name["config"]
    assert config.message_type.GetOptions().map_entry


def test_enum_values_match_felix() -> None:
    assert (pb.ANY, pb.IPV4, pb.IPV6) == (0, 4, 6)
    route_types = [pb.RouteType.Value(n) for n in pb.RouteType.keys()]  # noqa: SIM118 - enum wrapper, not a dict
    assert route_types == [0, 1, 2, 4, 8, 16, 32]
    assert (pb.NONE, pb.NO_ENCAP, pb.VXLAN, pb.IPIP) == (0, 1, 2, 3)
    assert (pb.IPSetUpdate.IP, pb.IPSetUpdate.IP_AND_PORT, pb.IPSetUpdate.NET) == (0, 1, 2)
    assert (pb.NO_ROLE, pb.SOURCE, pb.TARGET) == (0, 1, 2)


def _file_proto() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(proto)
    return proto


def _message_proto(name: str) -> descriptor_pb2.DescriptorProto:
    return next(m for m in _file_proto().message_type if m.name == name)


@pytest.mark.parametrize(
    ("message", "numbers", "names"),
    [
        ("ToDataplane", {35, 36, 37, 38}, {"host_metadata_v6_update", "host_metadata_v4v6_remove"}),
        ("Rule", {200}, {"log_prefix"}),
        ("PolicyID", {1}, {"tier"}),
        ("WorkloadEndpointID", {1}, {"hostname"}),
        ("HostEndpointID", {1}, {"hostname"}),
        ("RouteUpdate", {1}, {"type"}),
    ],
)
def test_reserved_fields(message: str, numbers: set[int], names: set[str]) -> None:
    proto = _message_proto(message)
    reserved = {n for r in proto.reserved_range for n in range(r.start, r.end)}
    assert numbers <= reserved
    assert names <= set(proto.reserved_name)


def test_package_and_services() -> None:
    assert pb.DESCRIPTOR.package == "felix"
    policy_sync = pb.DESCRIPTOR.services_by_name["PolicySync"]
    sync, report = policy_sync.methods_by_name["Sync"], policy_sync.methods_by_name["Report"]
    assert sync.output_type.full_name == "felix.ToDataplane" and sync.server_streaming
    assert report.input_type.full_name == "felix.DataplaneStats"
    assert report.output_type.full_name == "felix.ReportResult"
    stream = felixpy_pb2.DESCRIPTOR.services_by_name["Dataplane"].methods_by_name["Stream"]
    assert felixpy_pb2.DESCRIPTOR.package == "felixpy"
    assert stream.client_streaming and stream.server_streaming
    assert stream.input_type.full_name == "felixpy.ToDataplaneBatch"
    assert stream.output_type.full_name == "felixpy.FromDataplaneBatch"


def test_grpc_stubs_import_inside_the_package() -> None:
    from felixpy.proto import felixbackend_pb2_grpc, felixpy_pb2_grpc

    assert hasattr(felixbackend_pb2_grpc, "PolicySyncStub")
    assert hasattr(felixpy_pb2_grpc, "DataplaneStub")
    assert hasattr(felixpy_pb2_grpc, "add_DataplaneServicer_to_server")


def test_batch_carries_felix_envelopes() -> None:
    batch = felixpy_pb2.ToDataplaneBatch(
        messages=[messages.to_dataplane(0, pb.ConfigUpdate(config={"a": "b"})), messages.to_dataplane(1, pb.InSync())]
    )
    decoded = felixpy_pb2.ToDataplaneBatch.FromString(batch.SerializeToString())
    assert [messages.payload_of(m)[0] for m in decoded.messages] == ["config_update", "in_sync"]


def test_importing_the_proto_package_is_light() -> None:
    code = (
        "import sys, felixpy.proto\n"
        "assert 'grpc' not in sys.modules\n"
        "assert 'felixpy.proto.felixbackend_pb2' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# --------------------------------------------------------------------------
# felixpy.messages.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("fd", TO_FIELDS, ids=lambda fd: fd.name)
def test_to_dataplane_wraps_every_payload_type(fd: FieldDescriptor) -> None:
    payload = fill_all(getattr(pb, fd.message_type.name)())

    envelope = messages.to_dataplane(41, payload)

    assert envelope.sequence_number == 41
    name, inner = messages.payload_of(envelope)
    assert name == fd.name == messages.to_field_for(payload)
    assert inner == payload


@pytest.mark.parametrize("fd", FROM_FIELDS, ids=lambda fd: fd.name)
def test_from_dataplane_wraps_every_payload_type(fd: FieldDescriptor) -> None:
    payload = fill_all(getattr(pb, fd.message_type.name)())

    envelope = messages.from_dataplane(5, payload)

    assert envelope.sequence_number == 5
    assert messages.from_payload_of(envelope) == (fd.name, payload)


def test_empty_payloads_are_still_set() -> None:
    assert messages.payload_of(messages.to_dataplane(0, pb.InSync()))[0] == "in_sync"
    assert messages.from_payload_of(messages.from_dataplane(0, pb.DataplaneInSync()))[0] == "dataplane_in_sync"


def test_wrapping_copies_the_payload() -> None:
    payload = pb.IPSetUpdate(id="s:a", members=["10.0.0.1"])
    envelope = messages.to_dataplane(0, payload)
    payload.members.append("10.0.0.2")
    assert list(envelope.ipset_update.members) == ["10.0.0.1"]


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda: messages.payload_of(pb.ToDataplane(sequence_number=3)), "ToDataplane has no payload set"),
        (lambda: messages.from_payload_of(pb.FromDataplane()), "FromDataplane has no payload set"),
        (lambda: messages.to_dataplane(0, pb.Rule()), "felix.Rule is not a ToDataplane payload"),
        (lambda: messages.to_dataplane(0, pb.ProcessStatusUpdate()), "not a ToDataplane payload"),
        (lambda: messages.from_dataplane(0, pb.InSync()), "felix.InSync is not a FromDataplane payload"),
        (lambda: messages.to_field_for(pb.PortRange()), "felix.PortRange is not a ToDataplane payload"),
    ],
)
def test_unknown_payload_errors(call: Any, pattern: str) -> None:
    with pytest.raises(messages.UnknownPayload, match=pattern) as info:
        call()
    assert isinstance(info.value, ValueError)


# --------------------------------------------------------------------------
# scripts/gen-proto.sh, run in a scratch copy of the tree.
# --------------------------------------------------------------------------

OUTPUTS = [
    f"felixpy/proto/{stem}{suffix}"
    for stem in ("felixbackend", "felixpy")
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
]


@pytest.fixture
def scratch_tree(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy2(REPO / "scripts/gen-proto.sh", tmp_path / "scripts/gen-proto.sh")
    shutil.copytree(REPO / "proto", tmp_path / "proto")
    return tmp_path


def _gen(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(tree / "scripts/gen-proto.sh")], env=env, check=True, capture_output=True, text=True
    )


def _mtimes(tree: Path) -> list[int]:
    return [(tree / out).stat().st_mtime_ns for out in OUTPUTS]


def test_gen_proto_generates_package_relative_imports(scratch_tree: Path) -> None:
    _gen(scratch_tree)
    for out in OUTPUTS:
        text = (scratch_tree / out).read_text()
        assert "\nimport felixbackend_pb2" not in text and "\nimport felixpy_pb2" not in text
    assert "from felixpy.proto import felixbackend_pb2 as" in (scratch_tree / OUTPUTS[3]).read_text()
    assert "from felixpy.proto import felixpy_pb2 as" in (scratch_tree / OUTPUTS[5]).read_text()


def test_gen_proto_is_idempotent_and_follows_proto_changes(scratch_tree: Path) -> None:
    _gen(scratch_tree)
    first = _mtimes(scratch_tree)

    assert _gen(scratch_tree).stderr == ""  # up to date: nothing done
    assert _mtimes(scratch_tree) == first

    future = time.time() + 5
    os.utime(scratch_tree / "proto/felixpy.proto", (future, future))
    assert "regenerated" in _gen(scratch_tree).stderr
    assert all(after > before for after, before in zip(_mtimes(scratch_tree), first, strict=True))
