"""BPF mode's state as ``felixpy explain`` reads it: a :class:`BPFView` over the pins (or fakes).

What is read (kernel only: the daemon may be stopped), all under the pin root:

* ``cali_iface`` — per ifindex: flags (WEP, HEP, READY per family, NOT_MANAGED), the interface
  name and the policy entry of each TC hook (``egress_policy_v<n>``: TC ingress, in
  ``cali_jump_ing`` — a workload's egress policy, a host endpoint's ingress policy;
  ``ingress_policy_v<n>``: TC egress, in ``cali_jump_egr`` — a workload's ingress policy, a host
  endpoint's egress policy: the driver fills the fields by hook for both kinds);
* the policy jump map slot — a prog-array lookup gives the program id, its info its name
  (``p<4|6><i|e>_<digest>``);
* ``felixpy-policy/<program name>`` — the program's source the daemon pinned beside it
  (:mod:`felixpy.bpf.policyload`): the :class:`~felixpy.bpf.policy_ir.PolicySet` and the
  IP-set name → id map it was built with;
* ``cali_v<n>_ip_sets`` (LPM: membership of the packet's address, port and protocol, keyed
  exactly as the program builds the key), ``cali_v<n>_routes`` (local host / local
  workload on this ifindex) and ``cali_v<n>_fsafes2`` (the failsafe ports, keyed as
  ``bpf-gpl/failsafe.h`` builds the key);
* ``xdp_policy_v<n>`` of a host endpoint's ``cali_iface`` entry — its untracked ingress policy's
  entry in ``xdp_cali_jump`` (the XDP program's).

Nothing is written and nothing is created: :func:`read_pins` opens each map from its pin, checks it is
felixpy's layout (else :class:`NotFelixpyPins`), and reads it only when an answer needs it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf.polsource import SOURCE_DIR, PolicySource, parse_source, read_pinned_source

_READY = {4: defs.IFACE_STATE_V4_READY, 6: defs.IFACE_STATE_V6_READY}
IFSTATE_PIN = "cali_iface"


class NotFelixpyPins(Exception):
    """The pin root holds no felixpy BPF state (no ``cali_iface`` of ours)."""


@dataclass(slots=True)
class Iface:
    ifindex: int
    name: str
    flags: int
    # family -> entry in the policy jump map of each TC hook.  ``cali_iface`` names the fields by the
    # workload's policy direction (``egress_policy_v<n>``: TC ingress, ``ingress_policy_v<n>``: TC
    # egress); a host endpoint's driver fills the same fields by hook, so for a HEP the TC ingress
    # entry (``egress_policy_v<n>``) holds its *ingress* policy.
    tc_ingress_entry: dict[int, int]   # in cali_jump_ing
    tc_egress_entry: dict[int, int]    # in cali_jump_egr
    xdp_entry: dict[int, int] = field(default_factory=dict)  # in xdp_cali_jump (untracked ingress policy)

    @property
    def is_wep(self) -> bool:
        return bool(self.flags & defs.IFACE_STATE_WEP)

    @property
    def is_hep(self) -> bool:
        return bool(self.flags & defs.IFACE_STATE_HEP) and not self.is_wep

    def ready(self, v: int) -> bool:
        return bool(self.flags & _READY[v])

    def entry(self, hook: int) -> dict[int, int]:
        return self.tc_ingress_entry if hook == defs.HOOK_TC_INGRESS else self.tc_egress_entry

    def describe_flags(self) -> str:
        names = [n for n, bit in (("WEP", defs.IFACE_STATE_WEP), ("V4_READY", defs.IFACE_STATE_V4_READY),
                                  ("V6_READY", defs.IFACE_STATE_V6_READY), ("HEP", defs.IFACE_STATE_HEP),
                                  ("NOT_MANAGED", defs.IFACE_STATE_NOT_MANAGED)) if self.flags & bit]
        return "|".join(names) or "0"


@dataclass
class BPFView:
    """What one read of the pins gives explain; lookups are lazy (one answer reads what it needs)."""

    pin_root: str
    ifaces: dict[int, Iface]
    slot_program: Callable[[int, int], str | None]   # (hook, entry) -> program name, None: empty slot
    source: Callable[[str], PolicySource | None]
    ipset_member: Callable[[int, int, str, int, int], bool]   # (v, set id, addr, port, proto)
    route_flags: Callable[[int, str], tuple[int, int] | None]  # (v, addr) -> (flags, ifindex)
    failsafe: Callable[[int, int, int, str, bool], bool]       # (v, proto, port, peer addr, outbound)
    ifindex_of: dict[str, int] = field(default_factory=dict)   # interface name -> ifindex (ip -j link)
    # The attach point's globals flags for (ifindex, hook, family); None: no globals entry.
    ap_flags: Callable[[int, int, int], int | None] = lambda _i, _h, _v: None
    # The host's route back to an address, as (route type, out-interface name); None: no route.
    # None as a whole: not known (the view was built without the host's routing).
    route_back: Callable[[int, str], tuple[str, str] | None] | None = None


def iface_from_value(ifindex: int, val: Any) -> Iface:
    name = bytes(val.name).split(b"\0", 1)[0].decode(errors="replace")
    tc_ing = {v: int(getattr(val, f"egress_policy_v{v}")) for v in (4, 6)}
    tc_egr = {v: int(getattr(val, f"ingress_policy_v{v}")) for v in (4, 6)}
    xdp = {v: int(getattr(val, f"xdp_policy_v{v}")) for v in (4, 6)}
    return Iface(ifindex, name, int(val.flags), {v: e for v, e in tc_ing.items() if e >= 0},
                 {v: e for v, e in tc_egr.items() if e >= 0}, {v: e for v, e in xdp.items() if e >= 0})


def view_from_maps(pin_root: str, maps: Callable[[str], Any], prog_name: Callable[[int], str | None],
                   source_blob: Callable[[str], bytes | None], ifindex_of: dict[str, int]) -> BPFView:
    """A view over map objects (the kernel's pinned :class:`~felixpy.bpf.maps.Map` or the fakes):
    ``maps(name)`` opens a map by spec name, ``prog_name`` resolves a prog-array value."""
    from felixpy.bpf import maps as bm

    ifstate = maps(bm.IFSTATE.name)
    ifaces: dict[int, Iface] = {}
    for key, val in ifstate.items():
        idx = int(key.value) if hasattr(key, "value") else int(key)
        ifaces[idx] = iface_from_value(idx, val)

    def slot_program(hook: int, entry: int) -> str | None:
        jm = maps({defs.HOOK_TC_INGRESS: bm.JUMP_ING, defs.HOOK_TC_EGRESS: bm.JUMP_EGR,
                   defs.HOOK_XDP: bm.XDP_JUMP}[hook].name)
        got = jm.get(ctypes.c_uint32(entry))
        if got is None:
            return None
        return prog_name(int(got.value) if hasattr(got, "value") else int(got))

    sources: dict[str, PolicySource | None] = {}

    def source(name: str) -> PolicySource | None:
        if name not in sources:
            blob = source_blob(name)
            sources[name] = parse_source(blob) if blob is not None else None
        return sources[name]

    def ipset_member(v: int, set_id: int, addr: str, port: int, proto: int) -> bool:
        m = maps((bm.IPSETS6 if v == 6 else bm.IPSETS4).name)
        k = mt.ipset_key(set_id, addr, port=port, protocol=proto, v6=(v == 6))
        k.prefixlen = mt.IPSET_FULL_PREFIX_V6 if v == 6 else mt.IPSET_FULL_PREFIX_V4
        return m.get(k) is not None

    def route_flags(v: int, addr: str) -> tuple[int, int] | None:
        m = maps((bm.ROUTES6 if v == 6 else bm.ROUTES4).name)
        got = m.get(mt.route_key(f"{addr}/{128 if v == 6 else 32}"))
        return None if got is None else (int(got.flags), int(got.if_index))

    def failsafe(v: int, proto: int, port: int, addr: str, outbound: bool) -> bool:
        # The key the main program builds (bpf-gpl/failsafe.h is_failsafe): full prefix over the
        # port, protocol and direction, then the peer's whole address; the LPM trie matches CIDRs.
        m = maps((bm.FSAFES6 if v == 6 else bm.FSAFES4).name)
        return m.get(mt.failsafe_key(proto, port, f"{addr}/{128 if v == 6 else 32}", outbound=outbound)) is not None

    def ap_flags(ifindex: int, hook: int, v: int) -> int | None:
        got = maps(bm.AP_GLOBALS.name).get(mt.ApKey(ifindex, hook))
        return None if got is None else int(getattr(got, f"v{v}").flags)

    return BPFView(pin_root, ifaces, slot_program, source, ipset_member, route_flags, failsafe, ifindex_of,
                   ap_flags)


def _kernel_prog_name(prog_id: int) -> str | None:
    from felixpy.bpf import syscall as sc

    info = sc.prog_info_by_id(prog_id)
    return f"<program id {prog_id}: gone>" if info is None else str(info.name)


def read_pins(pin_root: str, ifindex_of: dict[str, int],
              route_back: Callable[[int, str], tuple[str, str] | None] | None = None) -> BPFView:
    """The kernel's view: maps opened from their pins (read only; nothing is created)."""
    from felixpy.bpf import maps as bm
    from felixpy.bpf import syscall as sc
    from felixpy.bpf.errors import BPFSyscallError

    if not os.path.exists(os.path.join(pin_root, bm.IFSTATE.name)):
        raise NotFelixpyPins(f"no felixpy BPF pins under {pin_root} (no {bm.IFSTATE.name}); "
                             "pass --bpf-pin-root where the daemon pins (FELIXPY_BPF_PIN_ROOT)")
    specs = {s.name: s for s in bm.ALL_SPECS}
    opened: dict[str, bm.Map] = {}

    def maps(name: str) -> bm.Map:
        if name not in opened:
            path = os.path.join(pin_root, name)
            try:
                fd = sc.obj_get(path)
            except (BPFSyscallError, FileNotFoundError) as exc:
                raise NotFelixpyPins(f"cannot open {path}: {exc}") from exc
            info = sc.map_info(fd)
            spec = specs[name]
            if (info.type, info.key_size, info.value_size) != (spec.map_type, spec.key_size, spec.value_size):
                os.close(fd)
                raise NotFelixpyPins(f"{path} is not felixpy's {name} (type/key/value sizes "
                                     f"{info.type}/{info.key_size}/{info.value_size})")
            opened[name] = bm.Map(spec.sized(info.max_entries), fd, path)
        return opened[name]

    view = view_from_maps(pin_root, maps, _kernel_prog_name,
                          lambda n: read_pinned_source(os.path.join(pin_root, SOURCE_DIR, n)), ifindex_of)
    view.route_back = route_back
    return view
