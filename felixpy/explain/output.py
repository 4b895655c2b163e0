"""Printing an :class:`~.path.Explanation`: a short human report, or JSON for tools."""

from __future__ import annotations

import json

from felixpy.explain.path import Explanation


def to_json(ex: Explanation) -> str:
    return json.dumps(ex.json(), indent=2)


def to_text(ex: Explanation) -> str:
    lines = [f"packet:   {ex.packet}",
             f"mode:     {ex.mode}, IPv{ex.ip_version}, {ex.direction} path",
             "hooks:    " + ", ".join(f"{h['chain']} → {h['outcome']}" for h in ex.hook_chains)]
    if ex.dispatch:
        lines.append("dispatch: " + " → ".join(ex.dispatch))
    if ex.endpoints:
        lines.append("endpoint: " + ", ".join(ex.endpoints))
    for p in ex.policies:
        where = f"tier {p['tier']}, " if p.get("tier") else ""
        rule = (f", rule {p['rule_index']} of its IPv{ex.ip_version} rules (kernel rule "
                f"{p['kernel_rule']['position']}, cali:{p['kernel_rule']['hash']})") if "kernel_rule" in p else ""
        lines.append(f"{p['kind'] + ':':9} {p['name']} ({where}{p['direction']}) → {p['outcome']}{rule}")
    for s in ex.ip_sets:
        lines.append(f"ip set:   {s['set']} matched {s['direction']} {s['member']}")
    d = ex.decided_by
    if d is not None:
        if d.get("by") == "routing":
            lines.append(f"decided:  routing: {d['reason']}")
        elif d.get("by") in ("policy", "profile"):
            where = f" ({d['iface']} {d['hook']} program)" if "hook" in d else ""   # BPF mode: which program
            rule = f" rule {d['rule_index']}" if "rule_index" in d else ""
            lines.append(f"decided:  {d['kind']} {d['name']}{rule}{where}")
        elif "reason" in d:   # BPF mode: end of tier, default deny, not READY, no program...
            where = f" ({d['iface']} {d['hook']} program)" if "hook" in d else ""
            lines.append(f"decided:  {d['by']}{where}: {d['reason']}")
        else:
            why = "; ".join(d.get("comments") or []) or d.get("action", "")
            lines.append(f"decided:  {d['chain']} rule {d['rule']} (cali:{d['hash']}) {why}")
    lines.append(f"verdict:  {ex.verdict.upper()}")
    for n in ex.notes:
        lines.append(f"note:     {n}")
    for u in ex.uncertain:
        lines.append(f"caution:  {u}")
    return "\n".join(lines)
