"""Screening of hostile datastore objects, once, before any manager sees them.

The calc graph normally sends only what the API server validated, but the dataplane must survive any
feed (issue #14: a structure-aware fuzzer found these): an object whose identity or interface name no
kernel tool can take would otherwise reach several managers (endpoint chains, DSCP, floating IPs,
routes, sysctl paths under ``/proc/sys/net/*/conf/<iface>``) and fail a whole table transaction, or
worse be spliced into ``iptables-restore``/``ipset restore`` input.

:func:`screen` returns the message to fan out — unchanged, or replaced — or None to drop it, and logs an
error naming the object for every rejection.  An update that is rejected becomes a *remove* of the same
id, so a previously good version of the object does not linger programmed with stale content (fail
closed: an endpoint without chains is dropped by the dispatch chains).

Rules:

* interface names (workload endpoints; host endpoints, where ``*`` and empty are also allowed): the
  kernel's ``dev_valid_name`` (1-15 bytes, not ``.``/``..``, no ``/``, ``:`` or whitespace), and only
  letters, digits and ``_.@=%,~^-`` (what ``iptables-restore``, ``nft`` and ``/proc/sys`` paths take
  unquoted; never the wildcards ``+``/``*``, which would make one endpoint's rules match every
  interface; no leading ``-``, which the tools would read as an option);
* endpoints that refer to undefined policies or profiles, rules that match undefined IP sets: see
  :class:`Screen`;
* IP set ids: the form rule references are held to (:data:`~felixpy.rules.ipset_names.SET_ID_RE`), since
  the id becomes the kernel set name.
"""

from __future__ import annotations

import re
from typing import Any

import structlog

from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules.ipset_names import SET_ID_RE
from felixpy.rules.names import kind_is_staged

log = structlog.get_logger(__name__)

IFNAMSIZ = 16
# Printable ASCII without blank, quote, backslash, "/" or ":", and without the iptables/nft wildcards
# "+" and "*": an endpoint named "cali+" would otherwise match every workload interface.
_IFACE_OK = re.compile(r"\A[A-Za-z0-9_.@=%,~^-]+\Z")
_SHOWN = 80  # characters of a hostile value quoted in a log line


def iface_problem(name: str, *, wildcard_ok: bool = False) -> str | None:
    """Why *name* cannot be an interface name (None when it can)."""
    if wildcard_ok and name in ("", "*"):
        return None
    if not name:
        return "empty interface name"
    if len(name.encode("utf-8", "surrogatepass")) >= IFNAMSIZ:
        return f"interface name longer than {IFNAMSIZ - 1} bytes"
    if name in (".", "..") or name.startswith("-") or not _IFACE_OK.match(name):
        return "interface name has characters no interface name can have"
    return None


def shown(value: str) -> str:
    """A hostile value as a log line shows it: repr, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}… ({len(value)} characters)"


_Key = tuple[str, ...]
_PolicyKey = tuple[str, str, str]


def _ep_key(msg: Any) -> _Key:
    if isinstance(msg, (pb.WorkloadEndpointUpdate, pb.WorkloadEndpointRemove)):
        return ("workload", msg.id.orchestrator_id, msg.id.workload_id, msg.id.endpoint_id)
    return ("host", msg.id.endpoint_id)


def _refs(msg: Any) -> tuple[frozenset[_PolicyKey], frozenset[str]]:
    """The (non-staged) policies and the profiles an endpoint update refers to."""
    ep = msg.endpoint
    tiers = list(ep.tiers)
    if isinstance(msg, pb.HostEndpointUpdate):
        tiers += [*ep.untracked_tiers, *ep.pre_dnat_tiers, *ep.forward_tiers]
    policies = {(p.name, p.namespace, p.kind) for t in tiers for p in (*t.ingress_policies, *t.egress_policies)
                if not kind_is_staged(p.kind)}
    return frozenset(policies), frozenset(ep.profile_ids)


def _same_refs(old: Any, new: Any) -> bool:
    """Whether two updates of one endpoint name the same tiers and profiles (a protobuf comparison, in C:
    cheaper than working out the references of *new*)."""
    a, b = old.endpoint, new.endpoint
    if a.tiers != b.tiers or a.profile_ids != b.profile_ids:
        return False
    if isinstance(new, pb.HostEndpointUpdate):
        return bool(a.untracked_tiers == b.untracked_tiers and a.pre_dnat_tiers == b.pre_dnat_tiers
                    and a.forward_tiers == b.forward_tiers)
    return True


def _without_refs(msg: Any) -> Any:
    """The endpoint with no tiers and no profiles: its chains drop everything (fail closed)."""
    out = type(msg)()
    out.CopyFrom(msg)
    ep = out.endpoint
    del ep.tiers[:]
    del ep.profile_ids[:]
    if isinstance(out, pb.HostEndpointUpdate):
        del ep.untracked_tiers[:]
        del ep.pre_dnat_tiers[:]
        del ep.forward_tiers[:]
    return out


_SET_FIELDS = ("src_ip_set_ids", "dst_ip_set_ids", "not_src_ip_set_ids", "not_dst_ip_set_ids",
               "src_named_port_ip_set_ids", "dst_named_port_ip_set_ids", "not_src_named_port_ip_set_ids",
               "not_dst_named_port_ip_set_ids", "dst_ip_port_set_ids")
_SET_FIELD_DESCRIPTORS = frozenset(pb.Rule.DESCRIPTOR.fields_by_name[f] for f in _SET_FIELDS)
_SET_TYPES = frozenset(pb.IPSetUpdate.IPSetType.values())


def set_refs(body: Any) -> frozenset[str]:
    """The well-formed IP-set ids a policy's or profile's rules match on.

    One ``ListFields`` per rule (only the fields it sets) rather than reading all nine set-id fields: this
    runs for every policy update, and under a flood that was ~10 % of the runner thread.
    """
    found: set[str] = set()
    wanted = _SET_FIELD_DESCRIPTORS
    for rules in (body.inbound_rules, body.outbound_rules):
        for rule in rules:
            for fd, value in rule.ListFields():
                if fd in wanted:
                    found.update(value)
    if not found:
        return frozenset()
    return frozenset(sid for sid in found if SET_ID_RE.match(sid))


def _deny_all(msg: Any) -> Any:
    """The policy or profile with one rule per direction: deny (fail closed)."""
    out = type(msg)()
    out.CopyFrom(msg)
    body = out.policy if isinstance(out, pb.ActivePolicyUpdate) else out.profile
    for rules in (body.inbound_rules, body.outbound_rules):
        del rules[:]
        rules.append(pb.Rule(action="deny"))
    return out


def _unindex(index: dict[Any, set[_Key]], refs: frozenset[Any], key: _Key) -> None:
    for ref in refs:
        keys = index.get(ref)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del index[ref]


class Screen:
    """The stateful half: references to objects the feed never defined.

    A jump to a chain nobody defined fails the whole ``iptables-restore``/``nft`` transaction (every
    table update blocked, then the retries run out and the daemon exits), so such an endpoint is
    programmed *without* its policies and profiles — its chains drop everything — with an error naming
    it and what is missing, until they are defined; then its real update is replayed.  A policy or
    profile removed while endpoints still refer to it does the same to them.  Likewise a policy or profile
    whose rules match an IP set nobody defined (or that was removed) is programmed as *deny all* until
    the set exists.  (Felix's calc graph never sends any of these; a hostile or buggy feed may.)
    """

    def __init__(self) -> None:
        self._policies: set[_PolicyKey] = set()
        self._profiles: set[str] = set()
        # The messages are held as their wire bytes, parsed again when replayed (rarely): a parsed protobuf
        # message is resident at ~25 times its wire size (a ten-rule policy: 374 bytes on the wire, ~10 KiB
        # parsed), and at the node-scale profiles the 1,000 policies alone were ~10 MiB (#17).
        self._endpoints: dict[_Key, tuple[bytes, frozenset[_PolicyKey], frozenset[str]]] = {}
        self._blocked: set[_Key] = set()
        # Reverse indexes, so a policy or profile event costs its referrers, never a scan of all endpoints.
        self._by_policy: dict[_PolicyKey, set[_Key]] = {}
        self._by_profile: dict[str, set[_Key]] = {}
        # IP sets named by policy and profile rules: a rule matching a set nobody defined fails the
        # transaction too; its policy or profile is programmed to deny all until the set exists.
        self._sets: set[str] = set()
        self._holders: dict[_Key, tuple[bytes, frozenset[str]]] = {}
        self._by_set: dict[str, set[_Key]] = {}
        self._denied: set[_Key] = set()

    def __call__(self, msg: Any) -> list[Any]:
        if type(msg) is pb.IPSetDeltaUpdate and SET_ID_RE.match(msg.id):
            return [msg]  # the commonest message under churn: only its id is screened
        first = screen(msg)
        if first is None:
            return []
        msg = first
        if isinstance(msg, (pb.WorkloadEndpointUpdate, pb.HostEndpointUpdate)):
            key = _ep_key(msg)
            old = self._endpoints.get(key)
            if old is not None and _same_refs(type(msg).FromString(old[0]), msg):  # the common resend: same tiers
                policies, profiles = old[1], old[2]
            else:
                policies, profiles = _refs(msg)
                if old is None or old[1] != policies or old[2] != profiles:
                    self._forget(key)
                    for pk in policies:
                        self._by_policy.setdefault(pk, set()).add(key)
                    for name in profiles:
                        self._by_profile.setdefault(name, set()).add(key)
            self._endpoints[key] = (msg.SerializeToString(), policies, profiles)  # same references: the indexes stand
            return [self._checked(key, msg)]
        if isinstance(msg, (pb.WorkloadEndpointRemove, pb.HostEndpointRemove)):
            self._forget(_ep_key(msg))
            return [msg]
        if isinstance(msg, (pb.IPSetUpdate, pb.IPSetRemove)):
            return self._on_set(msg)
        if isinstance(msg, (pb.ActivePolicyUpdate, pb.ActivePolicyRemove)):
            pk = (msg.id.name, msg.id.namespace, msg.id.kind)
            defined = isinstance(msg, pb.ActivePolicyUpdate)
            msg = self._rules_checked(("policy", *pk), msg)
            if defined == (pk in self._policies):
                return [msg]  # an update of a known policy (the common case) changes no reference
            (self._policies.add if defined else self._policies.discard)(pk)
            return [msg, *self._recheck(self._by_policy.get(pk, ()))]
        if isinstance(msg, (pb.ActiveProfileUpdate, pb.ActiveProfileRemove)):
            name = msg.id.name
            defined = isinstance(msg, pb.ActiveProfileUpdate)
            msg = self._rules_checked(("profile", name), msg)
            if defined == (name in self._profiles):
                return [msg]
            (self._profiles.add if defined else self._profiles.discard)(name)
            return [msg, *self._recheck(self._by_profile.get(name, ()))]
        return [msg]

    # ------------------------------------------------------------------ IP sets named by rules
    def _on_set(self, msg: Any) -> list[Any]:
        sid = msg.id
        defined = isinstance(msg, pb.IPSetUpdate) and msg.type in _SET_TYPES
        if defined == (sid in self._sets):
            return [msg]
        (self._sets.add if defined else self._sets.discard)(sid)
        redone = [self._holder_checked(h) for h in sorted(self._by_set.get(sid, ()))]
        # Deny-all versions before the removal of the set they stop referring to (one batch either way).
        return [*redone, msg] if not defined else [msg, *redone]

    def _rules_checked(self, holder: _Key, msg: Any) -> Any:
        if isinstance(msg, (pb.ActivePolicyRemove, pb.ActiveProfileRemove)):
            old = self._holders.pop(holder, None)
            if old is not None:
                _unindex(self._by_set, old[1], holder)
            return msg
        sets = set_refs(msg.policy if isinstance(msg, pb.ActivePolicyUpdate) else msg.profile)
        old = self._holders.get(holder)
        if old is None or old[1] != sets:  # the common update names the same sets: the index stands
            if old is not None:
                _unindex(self._by_set, old[1], holder)
            for sid in sets:
                self._by_set.setdefault(sid, set()).add(holder)
        self._holders[holder] = (msg.SerializeToString(), sets)
        return self._holder_checked(holder, msg)

    def _holder_checked(self, holder: _Key, msg: Any = None) -> Any:
        """*holder*'s update as it is to be programmed (*msg*: that update, if at hand; else the held
        one, parsed again)."""
        wire, sets = self._holders[holder]
        if msg is None:
            msg = (pb.ActivePolicyUpdate if holder[0] == "policy" else pb.ActiveProfileUpdate).FromString(wire)
        missing = sets - self._sets if sets else sets
        if not missing:
            if holder in self._denied:
                self._denied.discard(holder)
                log.info("Rules' IP sets are all defined now; programming them", owner=holder)
            return msg
        self._denied.add(holder)
        log.error("Rules refer to IP sets never defined; programming them to deny all until they are",
                  owner=holder[0], id=[shown(str(p)) for p in holder[1:]], ip_sets=sorted(shown(m) for m in missing)[:10])
        return _deny_all(msg)

    def _forget(self, key: _Key) -> None:
        old = self._endpoints.pop(key, None)
        self._blocked.discard(key)
        if old is None:
            return
        _unindex(self._by_policy, old[1], key)
        _unindex(self._by_profile, old[2], key)

    def _checked(self, key: _Key, msg: Any = None) -> Any:
        """Endpoint *key*'s update as it is to be programmed (*msg*: that update, if at hand; else the
        held one, parsed again)."""
        wire, policies, profiles = self._endpoints[key]
        if msg is None:
            msg = (pb.WorkloadEndpointUpdate if key[0] == "workload" else pb.HostEndpointUpdate).FromString(wire)
        missing_pols = policies - self._policies
        missing_profs = profiles - self._profiles
        if not missing_pols and not missing_profs:
            if key in self._blocked:
                self._blocked.discard(key)
                log.info("Endpoint's policies and profiles are all defined now; programming it", endpoint=key)
            return msg
        self._blocked.add(key)
        log.error("Endpoint refers to undefined policies or profiles; programming it to drop all traffic "
                  "until they are defined", endpoint=key,
                  policies=sorted(f"{k or '-'}/{ns + '/' if ns else ''}{shown(n)}" for n, ns, k in missing_pols)[:10],
                  profiles=sorted(shown(p) for p in missing_profs)[:10])
        return _without_refs(msg)

    def _recheck(self, keys: Any) -> list[Any]:
        return [self._checked(key) for key in sorted(keys)]


def screen(msg: Any) -> Any | None:
    """*msg*, its replacement, or None (see the module doc)."""
    if isinstance(msg, pb.WorkloadEndpointUpdate):
        why = iface_problem(msg.endpoint.name)
        if why is not None:
            wid = msg.id
            log.error("Rejecting workload endpoint: bad interface name; removing it", reason=why,
                      endpoint=(wid.orchestrator_id, wid.workload_id, wid.endpoint_id),
                      iface=shown(msg.endpoint.name))
            return pb.WorkloadEndpointRemove(id=msg.id)
    elif isinstance(msg, pb.HostEndpointUpdate):
        why = iface_problem(msg.endpoint.name, wildcard_ok=True)
        if why is not None:
            log.error("Rejecting host endpoint: bad interface name; removing it", reason=why,
                      host_endpoint=msg.id.endpoint_id, iface=shown(msg.endpoint.name))
            return pb.HostEndpointRemove(id=msg.id)
    elif isinstance(msg, (pb.IPSetUpdate, pb.IPSetDeltaUpdate, pb.IPSetRemove)):
        if not SET_ID_RE.match(msg.id):
            log.error("Rejecting IP set with a malformed id", set_id=shown(msg.id), msg_type=type(msg).__name__)
            return None
    return msg
