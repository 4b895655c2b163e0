"""WireGuard keys: generate a private key and derive its public key (X25519, RFC 7748).

Only the public-key derivation is needed (the kernel does the handshakes); it
is small enough to carry here rather than pull in a crypto library.
"""

from __future__ import annotations

import base64
import os

# --- X25519 (RFC 7748), only to derive the public key from the private key ---------------
_P = 2**255 - 19
_A24 = 121665


def _x25519(k: bytes, u: bytes) -> bytes:
    kb = bytearray(k)
    kb[0] &= 248
    kb[31] &= 127
    kb[31] |= 64
    scalar = int.from_bytes(kb, "little")
    x1 = int.from_bytes(u, "little") & ((1 << 255) - 1)
    x2, z2, x3, z3, swap = 1, 0, x1, 1, 0
    for t in reversed(range(255)):
        bit = (scalar >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % _P, (x2 - z2) % _P
        aa, bb = a * a % _P, b * b % _P
        e = (aa - bb) % _P
        c, d = (x3 + z3) % _P, (x3 - z3) % _P
        da, cb = d * a % _P, c * b % _P
        x3 = (da + cb) ** 2 % _P
        z3 = x1 * (da - cb) ** 2 % _P
        x2 = aa * bb % _P
        z2 = e * (aa + _A24 * e) % _P
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, _P - 2, _P) % _P).to_bytes(32, "little")


def generate_private_key() -> str:
    k = bytearray(os.urandom(32))
    k[0] &= 248
    k[31] &= 127
    k[31] |= 64
    return base64.b64encode(bytes(k)).decode()


def public_key_of(private_key_b64: str) -> str:
    return base64.b64encode(_x25519(base64.b64decode(private_key_b64), (9).to_bytes(32, "little"))).decode()
