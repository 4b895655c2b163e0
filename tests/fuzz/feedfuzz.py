"""Structure-aware hostile feeds: hypothesis strategies over every ``ToDataplane`` payload.

Three kinds of message, mixed in one stream:

* **generic** — any payload of the ``ToDataplane`` oneof (read from the descriptor, so a payload added
  to ``felixbackend.proto`` is fuzzed without code changes), every field filled with values biased to the
  hostile: by field name, addresses and CIDRs get invalid, mixed-family and out-of-range forms, names and
  ids get huge (up to 100,000 characters), empty, whitespace/newline/quote/NUL-bearing and non-ASCII
  strings; integers get the edges of their type and out-of-range ports and ICMP codes; enums get values
  the proto does not define.  Ids come from small pools, so updates, duplicates and removes of unknown ids
  collide all the time.
* **known bad** — objects with one defect the dataplane must reject with a logged reason naming the object
  (:class:`Bad` records the object's id and what it is): an endpoint with an invalid interface name or
  address, a policy or profile with a rule that cannot render, an IP set with an invalid member.
* **good** — the sentinel objects (:func:`sentinels`): a known-good endpoint with its policy, profile and
  IP set, in both families, which must stay programmed whatever comes around them.

Non-UTF-8 strings cannot be expressed in a parsed ``ToDataplane`` (protobuf refuses a string field that is
not UTF-8 at decode time, which drops the feed — the framing fuzz covers that); here "non-UTF-8 interface
names" are the names that survive decoding but are no interface name: non-ASCII, over 15 bytes, with
``/``, whitespace or NUL.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

from felixpy.proto import felixbackend_pb2 as pb

# ------------------------------------------------------------------------------------------- values
GOOD_V4 = ipaddress.ip_network("198.51.100.0/24")
GOOD_V6 = ipaddress.ip_network("2001:db8:ffff::/48")

HUGE = 100_000


def long_strings(huge: bool = True) -> st.SearchStrategy[str]:
    sizes = [16, 29, 32, 64, 256, 300, 4096] + ([HUGE] if huge else [])
    return st.builds(lambda c, n: c * n, st.sampled_from(["a", "Z", "9", "-", "é", " ", "\n", "/", "%"]),
                     st.sampled_from(sizes))


NASTY = ["", " ", "a b", "x\ny", "tab\there", "nul\x00byte", '"', "'", "-", "--", "!", "*", "../..", "a/b",
         "é", "☃", "\u200b", "\ufeff", "cali", "cali-", "cali12345678901", "cali123456789012", "eth0", "lo",
         "\\", "$(reboot)", "`id`", ";", "{}", "#", "-j ACCEPT", "\r\n-A INPUT -j ACCEPT", "\"; flush ruleset",
         "0", "-1", "65536", "::", "0.0.0.0/0", "::/0"]


def nasty_text(huge: bool = True) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(NASTY), st.text(max_size=24), long_strings(huge))


def _outside_good(text: str) -> bool:
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return True
    good = GOOD_V4 if net.version == 4 else GOOD_V6
    return not net.overlaps(good)  # type: ignore[arg-type]


def v4_cidrs() -> st.SearchStrategy[str]:
    return st.builds(lambda a, p: f"{a}/{p}", st.ip_addresses(v=4), st.integers(0, 32))


def v6_cidrs() -> st.SearchStrategy[str]:
    return st.builds(lambda a, p: f"{a}/{p}", st.ip_addresses(v=6), st.integers(0, 128))


BAD_CIDRS = ["10.0.0.0/33", "10.0.0.0/-1", "10.0.0.0/", "10.0.0/24", "256.0.0.1/32", "1.2.3.4/8/8", "fe80::/129",
             "fe80::1%eth0/128", ":::/64", "::ffff:10.0.0.1/128", "10.0.0.1 ", " 10.0.0.1", "0x0a000001",
             "010.000.000.001/32", "1.2.3.4/255.255.255.0", "1.2.3.4/0.0.0.255", "abc", "", "10.0.0.1,udp:80", "10.0.0.1-10.0.0.9"]


def addresses(huge: bool = True) -> st.SearchStrategy[str]:
    """CIDRs and addresses: both families (also where the other is expected), and malformed ones."""
    plain = st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str))
    return st.one_of(v4_cidrs(), v6_cidrs(), plain, st.sampled_from(BAD_CIDRS), nasty_text(huge)).filter(
        _outside_good)


INT_EDGES = [0, 1, -1, 7, 8, 22, 80, 255, 256, 1023, 65535, 65536, 2**31 - 1, -(2**31), 0x3F, 64, 4789, 1500]


def ints(field: FieldDescriptor) -> st.SearchStrategy[int]:
    lo, hi = {FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
              FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
              FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1)}.get(field.type, (-(2**31), 2**31 - 1))
    return st.one_of(st.sampled_from([e for e in INT_EDGES if lo <= e <= hi] + [lo, hi]), st.integers(lo, hi))


MACS = ["", "ee:ee:ee:ee:ee:ee", "00:00:00:00:00:00", "ff:ff:ff:ff:ff:ff", "zz:zz:zz:zz:zz:zz", "ee:ee:ee",
        "ee-ee-ee-ee-ee-ee", "eeee.eeee.eeee", "01:02:03:04:05:06:07:08"]


def ids(pool: str, huge: bool = True) -> st.SearchStrategy[str]:
    """Ids from a small pool (collisions), or hostile text."""
    return st.one_of(st.sampled_from([f"{pool}{i}" for i in range(4)]), nasty_text(huge)).filter(
        lambda s: "good" not in s)


def _string_for(name: str, huge: bool) -> st.SearchStrategy[str]:
    n = name.lower()
    if n in ("action", "default_action"):
        return st.one_of(st.sampled_from(["allow", "deny", "log", "pass", "next-tier", "", "drop", "ACCEPT"]),
                         nasty_text(huge))
    if n == "state":
        return st.one_of(st.sampled_from(["active", "inactive", "", "up"]), nasty_text(huge))
    if "mac" in n:
        return st.one_of(st.sampled_from(MACS), nasty_text(huge))
    if n in ("kind",):
        return st.one_of(st.sampled_from(["GlobalNetworkPolicy", "NetworkPolicy", "StagedNetworkPolicy",
                                          "KubernetesNetworkPolicy", ""]), nasty_text(huge))
    if any(k in n for k in ("net", "cidr", "addr", "_ip", "ips", "dst", "prefix", "ext_ip", "int_ip")) \
            or n in ("ip", "members", "added_members", "removed_members"):
        return addresses(huge)
    if "set_id" in n:  # the same pool as IPSetUpdate ids: rules name defined and undefined sets
        return ids("x", huge)
    if n == "profile_ids":
        return ids("prof", huge)
    if n == "name" or n.endswith("_id") or n in ("id", "hostname", "node", "namespace", "tier"):
        return ids("x", huge)
    return nasty_text(huge)


def message(desc: Descriptor, *, huge: bool = True, depth: int = 0) -> st.SearchStrategy[Any]:
    """A message of type *desc* with hostile fields (submessages to a few levels)."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in desc.fields:
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            assert f.message_type is not None
            if f.message_type.GetOptions().map_entry:
                fields[f.name] = st.dictionaries(nasty_text(huge), nasty_text(huge), max_size=3)
                continue
            if depth >= 3:
                continue
            sub: st.SearchStrategy[Any] = st.deferred(
                lambda mt=f.message_type: message(mt, huge=huge, depth=depth + 1))
        elif f.type == FieldDescriptor.TYPE_STRING:
            sub = _string_for(f.name, huge)
        elif f.type == FieldDescriptor.TYPE_BOOL:
            sub = st.booleans()
        elif f.type == FieldDescriptor.TYPE_ENUM:
            assert f.enum_type is not None
            sub = st.one_of(st.sampled_from([v.number for v in f.enum_type.values]), st.integers(-3, 99))
        elif f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            sub = st.floats(allow_nan=True)
        elif f.type == FieldDescriptor.TYPE_BYTES:
            sub = st.binary(max_size=16)
        else:
            sub = ints(f)
        if f.is_repeated:
            sub = st.lists(sub, max_size=3)
        fields[f.name] = st.one_of(st.none(), sub)

    def build(values: dict[str, Any]) -> Any:
        from google.protobuf import message_factory
        msg = message_factory.GetMessageClass(desc)()
        for name, value in values.items():
            if value is None:
                continue
            f = desc.fields_by_name[name]
            try:
                if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
                    getattr(msg, name).update(value)
                elif f.is_repeated:
                    if f.type == FieldDescriptor.TYPE_MESSAGE:
                        getattr(msg, name).extend(value)
                    else:
                        getattr(msg, name).extend(value)
                elif f.type == FieldDescriptor.TYPE_MESSAGE:
                    getattr(msg, name).CopyFrom(value)
                else:
                    setattr(msg, name, value)
            except (ValueError, TypeError):  # e.g. a lone surrogate in a str: cannot be on the wire at all
                pass
        return msg

    return st.fixed_dictionaries({}, optional=fields).map(build)


def _payload_descriptors() -> list[Descriptor]:
    fields = pb.ToDataplane.DESCRIPTOR.oneofs_by_name["payload"].fields
    return [f.message_type for f in fields if f.message_type is not None]


def generic_payloads(huge: bool = True) -> st.SearchStrategy[Any]:
    """Any payload type, every field hostile."""
    return st.one_of([message(d, huge=huge) for d in _payload_descriptors()])


# --------------------------------------------------------------------------------------- known bad
@dataclass(frozen=True)
class Bad:
    """A message the dataplane must reject with a log line naming *ident* (a substring of the line)."""

    msg: Any
    ident: str
    what: str


BAD_IFACES = ["cali" + "x" * 12, "cali+", "cali*", "cali x", "cali/x", "cali\nx", "calié", "cali\x00x", "cali\"x", "", " ",
              "cali" + "y" * HUGE, "-cali", "cali\tx"]


def _wid(name: str) -> pb.WorkloadEndpointID:
    return pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id=f"fuzz/{name}", endpoint_id="eth0")


@st.composite
def bad_objects(draw: st.DrawFn, huge: bool = True) -> Bad:
    n = draw(st.integers(0, 9999))
    kind = draw(st.sampled_from(["iface", "wep-net", "rule", "profile-rule", "member", "set-type"]))
    if kind == "iface":
        iface = draw(st.sampled_from(BAD_IFACES if huge else BAD_IFACES[:-3] + BAD_IFACES[-2:]))
        name = f"bad-iface-{n}"
        return Bad(pb.WorkloadEndpointUpdate(id=_wid(name), endpoint=pb.WorkloadEndpoint(
            state="active", name=iface, ipv4_nets=["10.200.0.1/32"])), f"fuzz/{name}", f"interface name {iface!r}")
    if kind == "wep-net":
        net = draw(st.sampled_from(BAD_CIDRS[:-2]).filter(bool))
        name = f"bad-net-{n}"
        return Bad(pb.WorkloadEndpointUpdate(id=_wid(name), endpoint=pb.WorkloadEndpoint(
            state="active", name=f"calibn{n}", ipv4_nets=[net], ipv6_nets=[net])), f"fuzz/{name}", f"address {net!r}")
    rule = draw(bad_rules())
    if kind == "rule":
        name = f"bad-rule-{n}"
        return Bad(pb.ActivePolicyUpdate(id=pb.PolicyID(name=name, kind="GlobalNetworkPolicy"), policy=pb.Policy(
            inbound_rules=[pb.Rule(action="allow"), rule], outbound_rules=[rule], tier="default")), name,
            f"rule {rule}")
    if kind == "profile-rule":
        name = f"bad-prof-{n}"
        return Bad(pb.ActiveProfileUpdate(id=pb.ProfileID(name=name), profile=pb.Profile(
            inbound_rules=[rule], outbound_rules=[pb.Rule(action="allow"), rule])), name, f"rule {rule}")
    if kind == "member":
        member = draw(st.sampled_from(["10.0.0.0/33", "fe80::/129", "abc", "10.0.0.1/8/8", "1.2.3.4 5"]))
        sid = f"s:bad-member-{n}"
        return Bad(pb.IPSetUpdate(id=sid, members=["10.1.0.1", member, "fd00::1"], type=pb.IPSetUpdate.NET), sid,
                   f"member {member!r}")
    sid = f"s:bad-type-{n}"
    return Bad(pb.IPSetUpdate(id=sid, members=["10.1.0.1"], type=draw(st.integers(3, 99))),  # type: ignore[arg-type]
               sid, "unknown set type")


@st.composite
def bad_rules(draw: st.DrawFn) -> pb.Rule:
    """A rule with exactly one defect that no family can render."""
    kind = draw(st.sampled_from(["port", "port-order", "icmp", "icmp-code", "net", "set", "action", "proto"]))
    if kind == "port":
        p = draw(st.sampled_from([65536, -1, 2**31 - 1, -(2**31)]))
        return pb.Rule(action="allow", protocol=pb.Protocol(name="tcp"), dst_ports=[pb.PortRange(first=p, last=p)])
    if kind == "port-order":
        return pb.Rule(action="allow", protocol=pb.Protocol(name="udp"), src_ports=[pb.PortRange(first=90, last=80)])
    if kind == "icmp":
        t = draw(st.sampled_from([256, -1, 2**31 - 1]))
        return pb.Rule(action="allow", ip_version=pb.IPV4, protocol=pb.Protocol(name="icmp"), icmp_type=t)
    if kind == "icmp-code":
        c = draw(st.sampled_from([256, -1, 9999]))
        return pb.Rule(action="allow", ip_version=pb.IPV6, protocol=pb.Protocol(name="icmpv6"),
                       icmp_type_code=pb.IcmpTypeAndCode(type=1, code=c))
    if kind == "net":
        return pb.Rule(action="allow", src_net=[draw(st.sampled_from(BAD_CIDRS[:-2]).filter(bool))])
    if kind == "set":
        return pb.Rule(action="allow", dst_ip_set_ids=[draw(st.sampled_from(["", "a b", "s:\n", "x" * 300]))])
    if kind == "action":
        return pb.Rule(action=draw(st.sampled_from(["ACCEPT", "drop", "jump", "\n"])))
    return pb.Rule(action="allow", protocol=pb.Protocol(number=draw(st.sampled_from([256, -1, 9999]))))


# --------------------------------------------------------------------------------------- good
GOOD_IFACE = "caligood0"
GOOD_SET = "s:goodset"
GOOD_POLICY = "good-policy"
GOOD_PROFILE = "good-profile"


def good_id() -> pb.WorkloadEndpointID:
    return pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id="fuzz/good", endpoint_id="eth0")


def sentinels() -> list[Any]:
    """The known-good world: one endpoint (both families), its policy (using an IP set) and profile."""
    allow_from_set = pb.Rule(action="allow", src_ip_set_ids=[GOOD_SET], protocol=pb.Protocol(name="tcp"),
                             dst_ports=[pb.PortRange(first=8080, last=8080)])
    return [
        pb.IPSetUpdate(id=GOOD_SET, members=["198.51.100.50", "2001:db8:ffff::50"], type=pb.IPSetUpdate.IP),
        pb.ActivePolicyUpdate(id=pb.PolicyID(name=GOOD_POLICY, kind="GlobalNetworkPolicy"), policy=pb.Policy(
            inbound_rules=[allow_from_set, pb.Rule(action="deny")], outbound_rules=[pb.Rule(action="allow")],
            tier="default", original_selector="good == 'yes'")),
        pb.ActiveProfileUpdate(id=pb.ProfileID(name=GOOD_PROFILE), profile=pb.Profile(
            inbound_rules=[pb.Rule(action="allow", src_net=["198.51.100.0/24"])],
            outbound_rules=[pb.Rule(action="allow")])),
        pb.WorkloadEndpointUpdate(id=good_id(), endpoint=pb.WorkloadEndpoint(
            state="active", name=GOOD_IFACE, mac="ee:ee:ee:ee:ee:ee", profile_ids=[GOOD_PROFILE],
            ipv4_nets=["198.51.100.7/32"], ipv6_nets=["2001:db8:ffff::7/128"],
            tiers=[pb.TierInfo(name="default", ingress_policies=[pb.PolicyID(name=GOOD_POLICY,
                                                                             kind="GlobalNetworkPolicy")],
                               egress_policies=[pb.PolicyID(name=GOOD_POLICY, kind="GlobalNetworkPolicy")])])),
    ]


# --------------------------------------------------------------------------------------- streams
Item = Any  # a payload message or a Bad


def streams(*, huge: bool = True, max_size: int = 60) -> st.SearchStrategy[list[Item]]:
    """A hostile stream: generic payloads and known-bad objects (the sentinels are interleaved by the runner)."""
    return st.lists(st.one_of(generic_payloads(huge), bad_objects(huge)), min_size=max(1, max_size // 2),
                    max_size=max_size)
