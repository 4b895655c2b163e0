"""The C rule hashes (felixpy._rulehash) against the Python reference (generictables/hashing.py).

The extension is optional for users (the package falls back to Python), but not for this
suite: setup builds it, and a build that silently failed would leave the fast path untested
and every node hashing four times slower.  So its absence fails here rather than skips.
"""

from __future__ import annotations

import base64
import hashlib
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from felixpy.drivers.generictables import hashing


def test_the_extension_is_built_and_used() -> None:
    from felixpy import _rulehash

    assert hashing.ACCELERATED
    assert hashing.rule_hashes is not hashing.py_rule_hashes
    assert _rulehash.chain_hashes("c", None, ["x"]) == hashing.py_rule_hashes("c", ["x"])


def _independent(chain: str, texts: list[str]) -> list[str]:
    """Felix's algorithm written out from its description, with neither implementation's tricks."""
    h = hashlib.sha224(chain.encode()).digest()
    out = []
    for t in texts:
        h = hashlib.sha224(h + t.encode()).digest()
        out.append(base64.urlsafe_b64encode(h).decode()[:16])
    return out


# Bodies as they come: mostly ASCII, some empty, some not ASCII, a few longer than the C
# side's 2 KiB assembly buffer (digested in several updates instead).
_body = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200),
    st.just(""),
    st.text(max_size=40).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)),
    st.integers(min_value=2000, max_value=5000).map(lambda n: "-m comment --comment " + "y" * n),
)
_name = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=40).filter(
    lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s))


@settings(max_examples=300, deadline=None)
@given(name=_name, bodies=st.lists(_body, max_size=30))
def test_c_equals_python_for_texts(name: str, bodies: list[str]) -> None:
    expected = hashing.py_rule_hashes(name, bodies)
    assert expected == _independent(name, bodies)
    assert hashing.rule_hashes(name, bodies) == expected
    assert hashing.rule_hashes(name, iter(bodies)) == expected  # any iterable, as the Python one takes
    assert hashing.rule_hashes(name, tuple(bodies)) == expected


@settings(max_examples=300, deadline=None)
@given(name=_name, bodies=st.lists(_body, max_size=30))
def test_c_equals_python_for_head_and_bodies(name: str, bodies: list[str]) -> None:
    head = f"-A {name} HASH"
    expected = hashing.py_rule_hashes_joined(name, head, bodies)
    assert expected == _independent(name, [head + " " + b if b else head for b in bodies])
    assert hashing.rule_hashes_joined(name, head, bodies) == expected


def test_no_rules_no_hashes() -> None:
    assert hashing.rule_hashes("cali-x", []) == []
    assert hashing.rule_hashes_joined("cali-x", "-A cali-x HASH", []) == []


def test_errors_are_the_pythons() -> None:
    with pytest.raises(UnicodeEncodeError):
        hashing.py_rule_hashes("c", ["\ud800"])
    with pytest.raises(UnicodeEncodeError):
        hashing.rule_hashes("c", ["ok", "\ud800"])
    with pytest.raises(TypeError):
        hashing.rule_hashes_joined("c", "h", ["ok", b"bytes"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        hashing.rule_hashes_joined("c", "h", 5)  # type: ignore[arg-type]


def test_big_chains_hashed_on_threads_at_once() -> None:
    """Threads hashing at once (as tables' hash-ahead threads do) each get their own chain's hashes:
    the extension keeps nothing between calls (one digest context per call)."""
    chains = {f"cali-tw-cali{i:011x}": [f"-m set --match-set cali40s:{i}-{j} src -j MARK --set-xmark 0x{j:x}/0xff"
                                        for j in range(2000)] for i in range(4)}
    expected = {n: hashing.py_rule_hashes_joined(n, f"-A {n} HASH", b) for n, b in chains.items()}
    got: dict[str, list[list[str]]] = {n: [] for n in chains}

    def work(n: str) -> None:
        for _ in range(5):
            got[n].append(hashing.rule_hashes_joined(n, f"-A {n} HASH", chains[n]))

    threads = [threading.Thread(target=work, args=(n,)) for n in chains]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in chains:
        assert got[n] == [expected[n]] * 5
