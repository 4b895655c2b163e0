"""Felix's rule-hash chain (the ``cali:<hash>`` comment).

h0 = SHA-224(chain name); for each rule i, h_i = SHA-224(h_{i-1} ‖ text_i); the
hash is the first 16 characters of the URL-safe, unpadded base64 of h_i.  The
text hashed is backend-specific (each backend passes its own rendering), so this
module only owns the chaining.  Inserted rules in kernel chains hash under the
chain name, appended ones under ``<chain>*appends*`` (callers pass that name).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable

HASH_LENGTH = 16


def rule_hashes(chain_name: str, rule_texts: Iterable[str]) -> list[str]:
    h = hashlib.sha224(chain_name.encode()).digest()
    out = []
    for text in rule_texts:
        h = hashlib.sha224(h + text.encode()).digest()
        out.append(base64.urlsafe_b64encode(h).decode().rstrip("=")[:HASH_LENGTH])
    return out
