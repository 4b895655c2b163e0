"""Felix's rule-hash chain (the ``cali:<hash>`` comment).

h0 = SHA-224(chain name); for each rule i, h_i = SHA-224(h_{i-1} ‖ text_i); the
hash is the first 16 characters of the URL-safe, unpadded base64 of h_i.  The
text hashed is backend-specific (each backend passes its own rendering), so this
module only owns the chaining.  Inserted rules in kernel chains hash under the
chain name, appended ones under ``<chain>*appends*`` (callers pass that name).

Speed (a restart hashes every rule of the node): the C extension
``felixpy._rulehash`` (``felixpy/_rulehash.c``, OpenSSL's SHA-224 and base64)
computes the same hashes ~4x faster (~0.55 against ~2 us a rule).  It is
optional: built by ``scripts/setup.sh`` and into the image's wheel; where it is
missing the functions below run in Python (:data:`ACCELERATED` says which, the
daemon logs it at start).  The Python versions are the reference, and the tests
hold the two to the same output.  In Python, 16 base64 characters encode exactly
the first 12 bytes of a digest, so the digests of a whole chain are truncated,
joined and encoded in one ``b2a_base64`` call and cut into 16-character pieces,
instead of encoding each 28-byte digest and trimming its text.
"""

from __future__ import annotations

import hashlib
from binascii import b2a_base64
from collections.abc import Iterable, Sequence

HASH_LENGTH = 16
_DIGEST_BYTES = HASH_LENGTH * 3 // 4  # 12 bytes encode to exactly 16 base64 characters, no padding
_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _encode(digests: list[bytes]) -> list[str]:
    """The 16-character hash of each (already truncated) digest."""
    if not digests:
        return []
    text = b2a_base64(b"".join(digests), newline=False).translate(_URLSAFE).decode("ascii")
    return [text[i:i + HASH_LENGTH] for i in range(0, len(text), HASH_LENGTH)]


def py_rule_hashes(chain_name: str, rule_texts: Iterable[str]) -> list[str]:
    """The hash of each of a chain's rule texts, in Python (the reference)."""
    sha = hashlib.sha224
    h = sha(chain_name.encode()).digest()
    digests: list[bytes] = []
    append = digests.append
    for text in rule_texts:
        h = sha(h + text.encode()).digest()
        append(h[:_DIGEST_BYTES])
    return _encode(digests)


def py_rule_hashes_joined(chain_name: str, head: str, bodies: Sequence[str]) -> list[str]:
    """:func:`py_rule_hashes` of ``head + " " + body`` for each body (just ``head`` for an empty body).

    The same hashes, without building the texts: the head is encoded once.
    """
    sha = hashlib.sha224
    h = sha(chain_name.encode()).digest()
    head_b = head.encode()
    head_sp = head_b + b" "
    digests: list[bytes] = []
    append = digests.append
    for body in bodies:
        h = sha(h + (head_sp + body.encode() if body else head_b)).digest()
        append(h[:_DIGEST_BYTES])
    return _encode(digests)


try:
    from felixpy._rulehash import chain_hashes as _c_chain_hashes
except ImportError:  # not built here: the Python versions serve
    ACCELERATED = False

    rule_hashes = py_rule_hashes
    rule_hashes_joined = py_rule_hashes_joined
else:
    ACCELERATED = True

    def rule_hashes(chain_name: str, rule_texts: Iterable[str]) -> list[str]:
        """The hash of each of a chain's rule texts (any iterable: the extension lists what is not a list
        or tuple, as PySequence_Fast does)."""
        hashes: list[str] = _c_chain_hashes(chain_name, None, rule_texts)
        return hashes

    def rule_hashes_joined(chain_name: str, head: str, bodies: Sequence[str]) -> list[str]:
        """:func:`rule_hashes` of ``head + " " + body`` for each body (just ``head`` for an empty body),
        without building the texts."""
        hashes: list[str] = _c_chain_hashes(chain_name, head, bodies)
        return hashes
