"""Ingress and egress policy by CIDR, IP set, port range, named port and ICMP type.

Each test puts an *ingress* policy on b and an *egress* policy on c (a and the
host keep the allow-all profile only), chosen so that every allow and every
block in the matrix is decided by exactly one of them:

* a → b is decided by b's ingress alone (a's egress allows all);
* c → a and c → host by c's egress alone (a's ingress and the host allow all);
* c → b must pass both.

Host → workload is not policed (Felix), so the host row always passes.
IP sets carry members of both families, as Felix sends them.
"""

from __future__ import annotations

from typing import Any

import pytest

from fv.datastore import HOST, addr, datastore, icmp_echo, icmp_echo_reply, nets, policy, workload
from fv.expect import ICMP, TCP, TCP_8081, TCP_9090, UDP, Expect
from fv.harness import FamilyView

pytestmark = pytest.mark.fv


def _b_in_c_out(ingress: str, egress: str) -> list[dict[str, Any]]:
    return [workload("a"), workload("b", ingress=[ingress]), workload("c", egress=[egress])]


def test_cidr(fv: FamilyView) -> None:
    """b admits only c's address; c may send only to b's.  Rules list both families' CIDRs."""
    fv.apply(datastore(
        policies=[policy("in-from-c", inbound=[{"action": "allow", "src_net": nets("c")}]),
                  policy("out-to-b", outbound=[{"action": "allow", "dst_net": nets("b")}])],
        workloads=_b_in_c_out("in-from-c", "out-to-b")))
    fv.check(Expect(True).block(src="a", dst="b").block(src="c", dst=["a", HOST]), (TCP, ICMP))


def test_ip_set_and_membership_change(fv: FamilyView) -> None:
    """IP sets stand in for selectors; a member added later (an IP-set delta) is let in at once."""
    sets = [{"id": "s:clients", "type": "net", "members": nets("c")},
            {"id": "s:servers", "type": "net", "members": nets("b")}]
    pols = [policy("in-from-clients", inbound=[{"action": "allow", "src_ip_set_ids": ["s:clients"]}]),
            policy("out-to-servers", outbound=[{"action": "allow", "dst_ip_set_ids": ["s:servers"]}])]
    wls = _b_in_c_out("in-from-clients", "out-to-servers")
    fv.apply(datastore(ipsets=sets, policies=pols, workloads=wls))
    fv.check(Expect(True).block(src="a", dst="b").block(src="c", dst=["a", HOST]), (TCP, ICMP),
             what="clients = {c}, servers = {b}")

    sets = [{"id": "s:clients", "type": "net", "members": nets("c", "a")},
            {"id": "s:servers", "type": "net", "members": nets("b", "a")}]
    fv.apply(datastore(ipsets=sets, policies=pols, workloads=wls))
    fv.check(Expect(True).block(src="c", dst=HOST), (TCP, ICMP), what="a added to both sets")


def test_port_range(fv: FamilyView) -> None:
    """b admits TCP 8080-8081; c may send TCP 8081-9090.  UDP and ICMP match neither."""
    fv.apply(datastore(
        policies=[policy("in-8080-8081", inbound=[{"action": "allow", "protocol": "tcp",
                                                    "dst_ports": ["8080:8081"]}]),
                  policy("out-8081-9090", outbound=[{"action": "allow", "protocol": "tcp",
                                                      "dst_ports": ["8081:9090"]}])],
        workloads=_b_in_c_out("in-8080-8081", "out-8081-9090")))
    fv.check(Expect(True)
             .block(dst="b", probe=[TCP_9090, UDP, ICMP])
             .block(src="c", probe=[TCP, UDP, ICMP])
             .allow(src=HOST),
             (TCP, TCP_8081, TCP_9090, UDP, ICMP))


def test_named_port(fv: FamilyView) -> None:
    """Named ports arrive as IP_AND_PORT sets: b's "http" is 8081; c may reach a's "metrics" (9090)
    and b's "http"."""
    v4 = {n: addr(n, 4) for n in "ab"}
    v6 = {n: addr(n, 6) for n in "ab"}
    sets = [{"id": "n:http-b", "type": "ip_and_port", "members": [f"{v4['b']},tcp:8081", f"{v6['b']},tcp:8081"]},
            {"id": "n:web", "type": "ip_and_port",
             "members": [f"{v4['a']},tcp:9090", f"{v6['a']},tcp:9090", f"{v4['b']},tcp:8081",
                         f"{v6['b']},tcp:8081"]}]
    fv.apply(datastore(
        ipsets=sets,
        policies=[policy("in-http", inbound=[{"action": "allow", "protocol": "tcp",
                                              "dst_named_port_ip_set_ids": ["n:http-b"]}]),
                  policy("out-web", outbound=[{"action": "allow", "protocol": "tcp",
                                               "dst_named_port_ip_set_ids": ["n:web"]}])],
        workloads=_b_in_c_out("in-http", "out-web")))
    fv.check(Expect(True)
             .block(dst="b", probe=[TCP, TCP_9090])
             .block(src="c")
             .allow(src="c", dst="a", probe=TCP_9090)
             .allow(src="c", dst="b", probe=TCP_8081)
             .allow(src=HOST),
             (TCP, TCP_8081, TCP_9090))


def test_icmp_type(fv: FamilyView) -> None:
    """b denies echo requests and allows the rest; c may send echo requests only; a may send
    echo *replies* only — so its pings (requests) are dropped: the type really is matched."""
    v = fv.v
    fv.apply(datastore(
        policies=[policy("in-no-ping", inbound=[{"action": "deny", **icmp_echo(v)}, {"action": "allow"}]),
                  policy("out-ping-only", outbound=[{"action": "allow", **icmp_echo(v)}]),
                  policy("out-pong-only", outbound=[{"action": "allow", **icmp_echo_reply(v)}])],
        workloads=[workload("a", egress=["out-pong-only"]), workload("b", ingress=["in-no-ping"]),
                   workload("c", egress=["out-ping-only"])]))
    fv.check(Expect(True)
             .block(dst="b", probe=ICMP)
             .block(src="c", probe=TCP)
             .block(src="a")
             .allow(src=HOST),
             (TCP, ICMP))
