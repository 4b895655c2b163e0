"""Golden rule hashes: typed rules → the ``cali:`` hashes a real Felix wrote.

Each expected hash below appears in public ``iptables-save`` / ``iptables -L``
dumps of nodes programmed by Calico Felix (e.g. ``-A FORWARD -m comment
--comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD``), so matching them proves a
table written by Felix and one written by felixpy agree rule for rule.  The
hashes are checked twice: through felixpy's renderer + hashing module, and by an
independent implementation of the documented algorithm over hand-written
rendered text (h0 = SHA-224(chain); h_i = SHA-224(h_{i-1} ‖ "-A <chain> HASH
<body>"); first 16 chars of unpadded URL-safe base64).
"""

from __future__ import annotations

import base64
import hashlib

import pytest

from felixpy.drivers.generictables.model import (
    ADDR_TYPE_LOCAL, Accept, Chain, Goto, Jump, Masquerade, Match, Rule, SetMark,
)
from felixpy.drivers.iptables import render
from felixpy.drivers.iptables.detect import Features

FEATURES = Features(SNATFullyRandom=True, MASQFullyRandom=True, RestoreSupportsLock=True, NFLogSize=True)


def independent_hashes(chain: str, texts: list[str]) -> list[str]:
    h = hashlib.sha224(chain.encode()).digest()
    out = []
    for t in texts:
        h = hashlib.sha224(h + t.encode()).digest()
        out.append(base64.urlsafe_b64encode(h).decode().replace("=", "")[:16])
    return out


def masq_via(dev: str) -> Rule:
    return Rule(Match().out_interface(dev).not_src_addr_type(ADDR_TYPE_LOCAL, True).src_addr_type(ADDR_TYPE_LOCAL),
                Masquerade())


GOLDEN = [
    # (hash chain name, rules, the rendered hash texts, hashes seen in Felix-programmed tables)
    ("FORWARD", [Rule(action=Jump("cali-FORWARD"))],
     ["-A FORWARD HASH --jump cali-FORWARD"], ["wUHhoiAYhphO9Mso"]),
    ("INPUT", [Rule(action=Jump("cali-INPUT"))],
     ["-A INPUT HASH --jump cali-INPUT"], ["Cz_u1IQiXIMmKD4c"]),
    ("OUTPUT", [Rule(action=Jump("cali-OUTPUT"))],
     ["-A OUTPUT HASH --jump cali-OUTPUT"], ["tVnHkvAo15HuiPy0"]),
    ("PREROUTING", [Rule(action=Jump("cali-PREROUTING"))],
     ["-A PREROUTING HASH --jump cali-PREROUTING"], ["6gwbT8clXdHdC1b1"]),
    ("POSTROUTING", [Rule(action=Jump("cali-POSTROUTING"))],
     ["-A POSTROUTING HASH --jump cali-POSTROUTING"], ["O3lYWMrLQYEMJtB5"]),
    ("cali-wl-to-host", [Rule(action=Jump("cali-from-wl-dispatch"))],
     ["-A cali-wl-to-host HASH --jump cali-from-wl-dispatch"], ["Ee9Sbo10IpVujdIY"]),
    ("cali-PREROUTING", [Rule(action=Jump("cali-fip-dnat"))],
     ["-A cali-PREROUTING HASH --jump cali-fip-dnat"], ["r6XmIziWUJsdOK6Z"]),
    ("cali-OUTPUT", [Rule(action=Jump("cali-fip-dnat"))],
     ["-A cali-OUTPUT HASH --jump cali-fip-dnat"], ["GBTAv2p5CwevEyJm"]),
    # Three-rule chain: position chaining, addrtype fragments and MASQ --random-fully (a feature flag).
    ("cali-POSTROUTING",
     [Rule(action=Jump("cali-fip-snat")), Rule(action=Jump("cali-nat-outgoing")), masq_via("vxlan.calico")],
     ["-A cali-POSTROUTING HASH --jump cali-fip-snat",
      "-A cali-POSTROUTING HASH --jump cali-nat-outgoing",
      ("-A cali-POSTROUTING HASH --out-interface vxlan.calico -m addrtype ! --src-type LOCAL --limit-iface-out "
       "-m addrtype --src-type LOCAL --jump MASQUERADE --random-fully")],
     ["Z-c7XtVd2Bq7s_hA", "nYKhEzDlr11Jccal", "e9dnSgSVNmIcpVhP"]),
    ("cali-POSTROUTING",
     [Rule(action=Jump("cali-fip-snat")), Rule(action=Jump("cali-nat-outgoing")), masq_via("tunl0")],
     ["-A cali-POSTROUTING HASH --jump cali-fip-snat",
      "-A cali-POSTROUTING HASH --jump cali-nat-outgoing",
      ("-A cali-POSTROUTING HASH --out-interface tunl0 -m addrtype ! --src-type LOCAL --limit-iface-out "
       "-m addrtype --src-type LOCAL --jump MASQUERADE --random-fully")],
     ["Z-c7XtVd2Bq7s_hA", "nYKhEzDlr11Jccal", "SXWvdsbh4Mw7wOln"]),
    # IP set matches with negation.
    ("cali-nat-outgoing",
     [Rule(Match().source_ip_set("cali40masq-ipam-pools").not_dest_ip_set("cali40all-ipam-pools"), Masquerade())],
     [("-A cali-nat-outgoing HASH -m set --match-set cali40masq-ipam-pools src "
       "-m set ! --match-set cali40all-ipam-pools dst --jump MASQUERADE --random-fully")],
     ["flqWnvo8yq4ULQLa"]),
    # Always-appended rules hash under "<chain>*appends*"; an extra comment is part of the text.
    ("FORWARD*appends*",
     [Rule(Match().mark_single_bit_set(0x10000), Accept(), ("Policy explicitly accepted packet.",)),
      Rule(action=SetMark(0x10000))],
     [('-A FORWARD*appends* HASH -m comment --comment "Policy explicitly accepted packet." '
       "-m mark --mark 0x10000/0x10000 --jump ACCEPT"),
      "-A FORWARD*appends* HASH --jump MARK --set-mark 0x10000/0x10000"],
     ["S93hcgKJrXEqnTfs", "mp77cMpurHhyjLrM"]),
]


@pytest.mark.parametrize("chain,rules,texts,expected", GOLDEN, ids=[g[0] + str(len(g[1])) for g in GOLDEN])
def test_felix_hashes(chain: str, rules: list[Rule], texts: list[str], expected: list[str]) -> None:
    bodies = [render.render_body(r, FEATURES) for r in rules]
    assert render.hash_texts(chain, bodies) == texts
    assert independent_hashes(chain, texts) == expected
    assert render.rule_hashes(chain, rules, FEATURES) == expected


def test_feature_flag_changes_the_hash() -> None:
    rules = [Rule(action=Jump("cali-fip-snat")), Rule(action=Jump("cali-nat-outgoing")), masq_via("tunl0")]
    without = render.rule_hashes("cali-POSTROUTING", rules, Features())
    assert without[:2] == ["Z-c7XtVd2Bq7s_hA", "nYKhEzDlr11Jccal"]
    assert without[2] != "SXWvdsbh4Mw7wOln"  # the --random-fully variant is what Felix wrote


def test_empty_rule_and_goto() -> None:
    # An empty rule renders as "-A <chain> HASH"; a goto as --goto.
    rules = [Rule(), Rule(action=Goto("cali-x"))]
    texts = ["-A cali-c HASH", "-A cali-c HASH --goto cali-x"]
    assert render.rule_hashes("cali-c", rules, FEATURES) == independent_hashes("cali-c", texts)


def test_table_writes_the_felix_hash_first() -> None:
    rnd = render.IptablesRenderer()
    line = rnd.render_append(Rule(action=Jump("cali-FORWARD")), "FORWARD", "wUHhoiAYhphO9Mso", FEATURES)
    assert line == '-A FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" --jump cali-FORWARD'
    chain = Chain("cali-x", (Rule(Match().protocol("tcp"), Accept(), ("c1",)),))
    h = render.rule_hashes(chain.name, chain.rules, FEATURES)[0]
    assert rnd.render_append(chain.rules[0], chain.name, h, FEATURES) == (
        f'-A cali-x -m comment --comment "cali:{h}" -m comment --comment "c1" -p tcp --jump ACCEPT')
