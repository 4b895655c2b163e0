# The C extension felixpy/_rulehash.c (optional; generictables/hashing.py falls back to Python).
from collections.abc import Sequence

def chain_hashes(chain_name: str, head: str | None, texts: Sequence[str], /) -> list[str]: ...
