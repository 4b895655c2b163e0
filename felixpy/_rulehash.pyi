# The C extension felixpy/_rulehash.c (optional; generictables/hashing.py falls back to Python).
from collections.abc import Iterable

def chain_hashes(chain_name: str, head: str | None, texts: Iterable[str], /) -> list[str]: ...
