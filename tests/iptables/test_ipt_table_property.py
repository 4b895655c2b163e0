"""Random update sequences and random drift: the table always converges, and a restart writes nothing."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from felixpy.drivers.generictables.model import Accept, Chain, Drop, Jump, Match, Return, Rule
from felixpy.drivers.iptables import render, savefile
from felixpy.drivers.iptables.detect import Features, StaticFeatures
from felixpy.drivers.iptables.fake import FakeIptables
from felixpy.drivers.iptables.metrics import get_metrics
from felixpy.drivers.iptables.table import IptablesTable
from felixpy.testing.clock import FakeClock

FEATURES = Features(MASQFullyRandom=True)
NAMES = [f"cali-c{i}" for i in range(5)]
LEAF_RULES = [Rule(Match().protocol("tcp").dest_ports(p), Accept()) for p in (80, 443)] + [
    Rule(Match().source_net("10.0.0.0/8"), Return()), Rule(action=Drop()), Rule(Match().protocol("udp"), Drop())]

rule_st = st.one_of(st.sampled_from(LEAF_RULES), st.sampled_from(NAMES[1:]).map(lambda n: Rule(action=Jump(n))))
chain_st = st.builds(lambda name, rules: Chain(name, tuple(rules)), st.sampled_from(NAMES),
                     st.lists(rule_st, max_size=5))
op_st = st.one_of(
    st.tuples(st.just("update"), chain_st),
    st.tuples(st.just("remove"), st.sampled_from(NAMES)),
    st.tuples(st.just("hook"), st.lists(st.sampled_from(NAMES), max_size=2)),
    st.tuples(st.just("apply"), st.none()),
)
drift_st = st.one_of(
    st.tuples(st.just("delete"), st.sampled_from(NAMES + ["FORWARD"]), st.integers(1, 6)),
    st.tuples(st.just("flush"), st.sampled_from(NAMES + ["FORWARD"]), st.none()),
    st.tuples(st.just("foreign"), st.sampled_from(NAMES + ["FORWARD"]), st.integers(1, 3)),
)


def make(fake: FakeIptables, backend: str, clock: FakeClock, mode: str) -> IptablesTable:
    return IptablesTable("filter", 4, runner=fake, backend=backend, features=StaticFeatures(FEATURES),
                         clock=clock.monotonic, sleep=clock.sleep, insert_mode=mode, metrics=get_metrics(CollectorRegistry()))


def apply_drift(fake: FakeIptables, drift: tuple[str, str, int | None]) -> None:
    kind, chain, n = drift
    if chain not in fake.chain_names("filter"):
        return
    length = len(fake.chain_specs("filter", chain))
    if kind == "delete" and n is not None and n <= length:
        fake.external_restore(f"*filter\n-D {chain} {n}\nCOMMIT\n")
    elif kind == "flush":
        fake.external_restore(f"*filter\n-F {chain}\nCOMMIT\n")
    elif kind == "foreign" and n is not None and n <= length + 1:
        fake.external_restore(f"*filter\n-I {chain} {n} -s 192.0.2.{n}/32 -j ACCEPT\nCOMMIT\n")


def reachable(chains: dict[str, Chain], start: str) -> set[str]:
    """Chains reachable from *start* by jumps (itself included)."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in chains:
            stack.extend(r.action.target for r in chains[n].rules if isinstance(r.action, Jump))
    return seen


def expected(chains: dict[str, Chain], hooks: list[str]) -> dict[str, list[str]]:
    referenced = set().union(*(reachable(chains, h) for h in hooks))
    return {n: render.rule_hashes(n, chains[n].rules, FEATURES) for n in referenced if n in chains}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(backend=st.sampled_from(["legacy", "nft"]), mode=st.sampled_from(["insert", "append"]),
       ops=st.lists(op_st, max_size=12), drifts=st.lists(drift_st, max_size=4),
       reread=st.booleans())
def test_converges(backend: str, mode: str, ops: list[tuple[str, object]],
                   drifts: list[tuple[str, str, int | None]], reread: bool) -> None:
    fake = FakeIptables(default_backend=backend)
    fake.external_restore("*filter\n-A FORWARD -j ACCEPT\nCOMMIT\n")
    clock = FakeClock()
    t = make(fake, backend, clock, mode)
    t.reread_before_write = reread
    chains: dict[str, Chain] = {}
    hooks: list[str] = []
    for kind, arg in ops:
        if kind == "update":
            assert isinstance(arg, Chain)
            # Jumps must point at chains that exist (a referenced but undefined chain is a caller bug).
            rules = tuple(r for r in arg.rules if not isinstance(r.action, Jump) or r.action.target in chains)
            if any(isinstance(r.action, Jump) and arg.name in reachable(chains, r.action.target) for r in rules):
                continue  # a jump loop: the kernel refuses it (ELOOP) and no renderer makes one
            c = Chain(arg.name, rules)
            chains[c.name] = c
            t.update_chain(c)
        elif kind == "remove":
            assert isinstance(arg, str)
            if any(isinstance(r.action, Jump) and r.action.target == arg for c in chains.values() for r in c.rules):
                continue
            if arg in hooks:
                continue
            chains.pop(arg, None)
            t.remove_chain_by_name(arg)
        elif kind == "hook":
            assert isinstance(arg, list)
            hooks = [h for h in dict.fromkeys(arg) if h in chains]
            t.insert_or_append_rules("FORWARD", [Rule(action=Jump(h)) for h in hooks])
        else:
            t.apply()
    t.apply()
    for d in drifts:
        apply_drift(fake, d)
    clock.advance(1000)  # past the refresh and post-write timers: re-read and repair
    t.apply()

    st_ = savefile.parse_save(fake.save("filter"), hash_re=savefile.hash_comment_regex(),
                              owned_re=savefile.owned_chain_regex())
    owned = {c: h for c, h in st_.hashes.items() if c.startswith("cali-")}
    assert owned == expected(chains, hooks)
    fwd = st_.hashes["FORWARD"]
    ours = render.rule_hashes("FORWARD", [Rule(action=Jump(h)) for h in hooks], FEATURES)
    foreign = [""] * fwd.count("")
    assert fwd == (ours + foreign if mode == "insert" else foreign + ours)

    # A restart against the converged table writes nothing.
    n = fake.restore_count()
    t2 = make(fake, backend, clock, mode)
    t2.update_chains(chains.values())
    t2.insert_or_append_rules("FORWARD", [Rule(action=Jump(h)) for h in hooks])
    t2.apply()
    assert fake.restore_count() == n
