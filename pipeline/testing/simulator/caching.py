"""OpenAI's prefix cache, as the simulator models it.

A prompt of at least ``min_tokens`` (1,024) tokens is served from cache for the longest
prefix an earlier prompt shared with it, rounded down to ``min_tokens`` plus a multiple
of ``step`` (128) tokens, and reported as ``usage.prompt_tokens_details.cached_tokens``.
Prompts share a cache only within one partition: the model, and the request's
``prompt_cache_key`` when it sends one. An entry lives ``ttl_s`` seconds after it was
last written or read.

The simulator counts four characters a token (``content.estimate_tokens``), so a prefix
of ``n`` tokens is the first ``4n`` characters of the messages' texts. Each boundary's
key is a chained hash of everything before it (the roles and where each message starts
included), so two prompts match at a boundary exactly when their messages agree up to it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

__all__ = ["CACHE_MIN_TOKENS", "CACHE_STEP_TOKENS", "CHARS_PER_TOKEN", "PrefixCache", "prefixes"]

CACHE_MIN_TOKENS: Final = 1024
CACHE_STEP_TOKENS: Final = 128
CHARS_PER_TOKEN: Final = 4
# Expired entries are swept every this many writes (the cache never grows without end).
_SWEEP_EVERY: Final = 4096


def prefixes(
    partition: str,
    messages: Sequence[tuple[str, str]],
    *,
    min_tokens: int = CACHE_MIN_TOKENS,
    step: int = CACHE_STEP_TOKENS,
) -> list[tuple[int, bytes]]:
    """The cacheable prefixes of a prompt: (tokens, key) at each boundary, shortest first.

    ``messages`` are (role, text) pairs in order; ``partition`` separates caches (the
    model and the prompt cache key).
    """
    h = hashlib.blake2b(partition.encode(), digest_size=16)
    out: list[tuple[int, bytes]] = []
    boundary = min_tokens * CHARS_PER_TOKEN  # in characters of the texts
    fed = 0
    for role, text in messages:
        h.update(b"\x00" + role.encode() + b"\x01")  # a message starts here
        i = 0
        while True:
            take = min(len(text) - i, boundary - fed)
            h.update(text[i : i + take].encode())
            i += take
            fed += take
            if fed == boundary:
                out.append((boundary // CHARS_PER_TOKEN, h.copy().digest()))
                boundary += step * CHARS_PER_TOKEN
            if i >= len(text):
                break
    return out


class PrefixCache:
    """Prefix keys seen, each with the time it expires."""

    __slots__ = ("_expires", "_writes")

    def __init__(self) -> None:
        self._expires: dict[bytes, float] = {}
        self._writes = 0

    def __len__(self) -> int:
        return len(self._expires)

    def serve(self, found: Sequence[tuple[int, bytes]], now: float, ttl_s: float) -> int:
        """Tokens served from cache for a prompt with prefixes ``found``; then cache them all."""
        cached = 0
        for tokens, key in reversed(found):
            if self._expires.get(key, -1.0) > now:
                cached = tokens
                break
        until = now + ttl_s
        for _, key in found:
            self._expires[key] = until
        self._writes += 1
        if self._writes % _SWEEP_EVERY == 0:
            self._expires = {k: t for k, t in self._expires.items() if t > now}
        return cached

    def clear(self) -> None:
        """Forget every entry."""
        self._expires.clear()
