"""The Python constants and map specs mirror the C headers exactly (parsed from bpf-gpl/)."""

from __future__ import annotations

import re
from pathlib import Path

from felixpy.bpf import defs, maps
from felixpy.bpf import syscall as sc

SRC = Path(__file__).resolve().parents[2] / "bpf-gpl"


def _text(*names: str) -> str:
    return "\n".join((SRC / n).read_text() for n in names)


def _defines(text: str, prefix: str) -> dict[str, int]:
    out = {}
    for m in re.finditer(rf"#define\s+({prefix}\w*)\s+(\(1\s*<<\s*\d+\)|0x[0-9a-fA-F]+|\d+)",
                         text):
        v = m.group(2)
        out[m.group(1)] = (1 << int(v.split("<<")[1].strip(" )"))) if "<<" in v else int(v, 0)
    return out


def _enum(text: str, name: str) -> dict[str, int]:
    body = re.search(rf"enum {name}\s*{{(.*?)}};", text, re.S).group(1)  # type: ignore[union-attr]
    out: dict[str, int] = {}
    nxt = 0
    for line in body.splitlines():
        line = re.sub(r"/\*.*?\*/|//.*", "", line).strip().rstrip(",")
        if not line:
            continue
        k, _, v = (p.strip() for p in line.partition("="))
        if v:
            nxt = out[v] if v in out else int(v, 0)
        out[k] = nxt
        nxt += 1
    return out


def test_compile_flags() -> None:
    d = _defines(_text("bpf.h"), "CALI_TC_")
    assert d["CALI_TC_HOST_EP"] == defs.TC_HOST_EP
    assert d["CALI_TC_INGRESS"] == defs.TC_INGRESS
    assert d["CALI_TC_PREAMBLE"] == defs.TC_PREAMBLE
    assert _defines(_text("bpf.h"), "CALI_XDP_PROG")["CALI_XDP_PROG"] == defs.XDP_PROG


def test_skb_marks() -> None:
    d = _defines(_text("bpf.h"), "CALI_SKB_MARK_")
    for k, v in d.items():
        assert getattr(defs, k.replace("CALI_SKB_", "")) == v, k


def test_reasons() -> None:
    e = _enum(_text("reasons.h"), "calico_reason")
    for r in defs.Reason:
        assert e["CALI_REASON_" + r.name if r.name != "TOTAL_PACKETS" else "COUNTER_TOTAL_PACKETS"] == r
    assert e["CALI_REASON_MAX_COUNTERS"] == defs.MAX_COUNTERS


def test_jump_indices() -> None:
    e = _enum(_text("jump.h"), "cali_jump_index")
    for p in defs.ProgIndex:
        assert e["PROG_INDEX_" + p.name] == p
        assert e["PROG_INDEX_" + p.name + "_DEBUG"] == p + defs.PROG_INDEX_DEBUG_OFFSET


def test_conntrack_constants() -> None:
    t = _text("conntrack_types.h")
    e = _enum(t, "calico_ct_result_type")
    for r in defs.CtResult:
        assert e["CALI_CT_" + r.name] == r
    d = _defines(t, "CT_RES_")
    for k, v in d.items():
        assert getattr(defs, k) == v
    f = _defines(t, "CALI_CT_FLAG_")
    for k in ("NAT_OUT", "SKIP_FIB", "BA", "SKIP_REDIR_PEER", "SET_DSCP"):
        assert f["CALI_CT_FLAG_" + k] == getattr(defs, "CT_FLAG_" + k)


def test_ifstate_routes_globals_state_flags() -> None:
    for k, v in _defines(_text("ifstate_types.h"), "IFACE_STATE_").items():
        assert getattr(defs, k) == v, k
    for k, v in _enum(_text("routes_types.h"), "cali_rt_flags").items():
        if k != "CALI_RT_UNKNOWN":
            assert getattr(defs, k.replace("CALI_", "")) == v, k
    for k, v in _enum(_text("globals_types.h"), "cali_globals_flags").items():
        assert getattr(defs, k.replace("CALI_", "")) == v, k
    for k, v in _enum(_text("types.h"), "cali_state_flags").items():
        assert getattr(defs, k.replace("CALI_", "")) == v, k
    e = _enum(_text("policy_types.h"), "calico_policy_result")
    assert (e["CALI_POL_ALLOW"], e["CALI_POL_DENY"], e["CALI_POL_TAIL_CALL_FAILED"]) == (
        defs.POL_ALLOW, defs.POL_DENY, defs.POL_TAIL_CALL_FAILED)


_TYPES = {"hash": sc.MAP_TYPE_HASH, "lru_hash": sc.MAP_TYPE_LRU_HASH, "lpm_trie": sc.MAP_TYPE_LPM_TRIE,
          "percpu_array": sc.MAP_TYPE_PERCPU_ARRAY, "percpu_hash": sc.MAP_TYPE_PERCPU_HASH,
          "prog": sc.MAP_TYPE_PROG_ARRAY}


def test_map_declarations_match_specs() -> None:
    text = "\n".join(p.read_text() for p in SRC.glob("*.h"))
    decls = {}
    for m in re.finditer(r'CALI_MAP\(\s*(\w+),\s*(\w+),\s*"(\w+)",\s*([^,]+),\s*([^,]+),\s*(\d+),\s*'
                         r'(\w+)\)', text):
        _ident, pinned, typ, _k, _v, size, flags = m.groups()
        decls[pinned] = (_TYPES[typ], int(size), sc.F_NO_PREALLOC if flags == "BPF_F_NO_PREALLOC" else 0)
    specs = {s.name: (s.map_type, s.max_entries, s.flags) for s in maps.ALL_SPECS}
    assert decls == specs
