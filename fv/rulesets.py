"""Rule snapshots for "nothing was rewritten" checks: ``iptables-save -c`` / ``nft -a list ruleset``.

A rule's identity is its line with the counters blanked (for nft that includes
the rule's handle, which a rewrite changes); a rewritten iptables rule starts
counting from zero again.  So two snapshots show no rewrite when the lines are
identical and no counter went down.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

_IPT_COUNTERS = re.compile(r"\[(\d+):(\d+)\]")
_NFT_COUNTERS = re.compile(r"counter packets (\d+) bytes (\d+)")


@dataclass(frozen=True)
class RuleLine:
    text: str  # the line with its counters blanked: a rule's identity (nft: incl. its handle)
    packets: int | None
    bytes: int | None


def parse_ruleset(text: str) -> list[RuleLine]:
    """``iptables-save -c`` or ``nft -a list ruleset`` output → lines with counters split off."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # iptables-save's "Generated/Completed on <date>" comments
        m = _IPT_COUNTERS.search(line) or _NFT_COUNTERS.search(line)
        if m is None:
            out.append(RuleLine(line, None, None))
            continue
        blank = "[]" if m.re is _IPT_COUNTERS else "counter"
        out.append(RuleLine(line[:m.start()] + blank + line[m.end():], int(m.group(1)), int(m.group(2))))
    return out


def compare_rulesets(before: list[RuleLine], after: list[RuleLine]) -> tuple[list[str], int]:
    """Problems (changed/rewritten rules, counters that went back) and how many counters grew."""
    problems: list[str] = []
    if [r.text for r in before] != [r.text for r in after]:
        delta = difflib.unified_diff([r.text for r in before], [r.text for r in after], "before", "after",
                                     lineterm="", n=1)
        problems.append("ruleset changed:\n" + "\n".join(list(delta)[:60]))
        return problems, 0
    grew = 0
    for b, a in zip(before, after):
        if b.packets is None or a.packets is None:
            continue
        if a.packets < b.packets or (a.bytes or 0) < (b.bytes or 0):
            problems.append(f"counters went back ({b.packets}→{a.packets} packets): rule rewritten: {a.text}")
        elif a.packets > b.packets:
            grew += 1
    return problems, grew
