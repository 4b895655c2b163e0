"""A bounded memo for pure parses of short strings (addresses, CIDRs, IP-set members).

The feed names the same few thousand addresses over and over (every endpoint update repeats its
addresses; a flood toggles two versions of each), so the parses on that path are memoised.  The feed
is also hostile: a call whose string argument is longer than anything the parse can accept runs
uncached, so 100k-character names never fill the memo.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

R = TypeVar("R")


class ShortStringMemo(Generic[R]):
    """*fn* (positional, hashable arguments) behind an ``lru_cache`` of *maxsize*, except for calls with
    a ``str`` argument longer than *longest*: those call *fn* directly.  A call that raises is not kept
    (``lru_cache``'s rule)."""

    def __init__(self, fn: Callable[..., R], longest: int, maxsize: int) -> None:
        self._fn = fn
        self._cached = functools.lru_cache(maxsize=maxsize)(fn)
        self._longest = longest
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Hashable) -> R:
        if any(isinstance(a, str) and len(a) > self._longest for a in args):
            return self._fn(*args)
        return self._cached(*args)

    def cache_info(self) -> functools._CacheInfo:
        return self._cached.cache_info()


def short_string_memo(longest: int, maxsize: int = 16384) -> Callable[[Callable[..., R]], ShortStringMemo[R]]:
    """Decorator form of :class:`ShortStringMemo`."""
    def wrap(fn: Callable[..., R]) -> ShortStringMemo[R]:
        return ShortStringMemo(fn, longest, maxsize)
    return wrap


LONGEST_CIDR = 49  # "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255/128": no longer address or CIDR parses
