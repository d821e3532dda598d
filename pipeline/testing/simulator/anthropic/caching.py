"""Anthropic's prompt cache, as the simulator models it: explicit breakpoints, nothing else.

A request's prompt is its blocks in Anthropic's order (tools, then system, then messages);
a ``cache_control`` breakpoint on a block names the prefix through that block. Only those
prefixes are ever cached, and only when they hold at least the model's minimum cacheable
length (``prices.min_cache_tokens``); a shorter one is processed without caching, no error.

- **Read.** From each breakpoint the cache is looked up at the breakpoint's own block and
  the ``LOOKBACK_BLOCKS`` (20) blocks before it, nearest first; the longest prefix found
  (over every breakpoint) is read. So a call that extends the previous one and moves its
  breakpoint forward reads the previous call's prefix, as long as it added at most 20
  blocks.
- **Write.** Everything from the read prefix up to the last cacheable breakpoint is
  written: the tokens up to the last ``1h`` breakpoint at the 1-hour rate, the rest at
  the 5-minute rate (``1h`` breakpoints must come before ``5m`` ones). Tokens after the
  last breakpoint are plain input. So ``input_tokens + cache_creation_input_tokens +
  cache_read_input_tokens`` is always the whole prompt.
- **Lifetime.** An entry expires its TTL (5 minutes or 1 hour) after it was last written
  or read, on the simulator's clock; a read refreshes it at no cost.

A prefix's key chains the model, each block's type, role and content (its JSON without
``cache_control``, so moving a breakpoint keeps the prefix), and two request options
Anthropic documents as invalidating the cache from where they apply: ``output_config``'s
format (its schema precedes the system prompt: a change misses system and messages) and
``tool_choice`` (a change misses the messages). Changing a tool misses everything.
The simulator counts four characters a token, so a prefix of ``c`` characters holds
``ceil(c / 4)`` tokens.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from .request import Block, Breakpoint, MessagesRequest

__all__ = ["LOOKBACK_BLOCKS", "BreakpointCache", "CacheUse", "Prefix", "prefix_of"]

LOOKBACK_BLOCKS: Final = 20
# Expired entries are swept every this many commits (the cache never grows without end).
_SWEEP_EVERY: Final = 4096


@dataclass(frozen=True, slots=True)
class Prefix:
    """A prompt as the cache sees it: the key and tokens of the prefix through each block."""

    keys: tuple[bytes, ...]
    tokens: tuple[int, ...]

    @property
    def total(self) -> int:
        """Tokens of the whole prompt."""
        return self.tokens[-1] if self.tokens else 0


def prefix_of(request: MessagesRequest) -> Prefix:
    """The keys and token counts of every block boundary of ``request``'s prompt."""
    return _chain(request.model, request.blocks, request.output_format, request.tool_choice)


def _chain(model: str, blocks: Sequence[Block], fmt: bytes, choice: bytes) -> Prefix:
    h = hashlib.blake2b(model.encode(), digest_size=16)
    keys: list[bytes] = []
    tokens: list[int] = []
    chars = 0
    section = "tools"
    for block in blocks:
        if section == "tools" and block.section != "tools":
            h.update(b"\x00format\x00" + fmt)
            section = "system"
        if section != "messages" and block.section == "messages":
            h.update(b"\x00tool_choice\x00" + choice)
            section = "messages"
        opener = f"\x00{block.section}\x00{block.role}\x00{int(block.opens)}\x00"
        h.update(opener.encode() + block.canonical)
        chars += len(block.text)
        keys.append(h.copy().digest())
        tokens.append(math.ceil(chars / 4))
    return Prefix(tuple(keys), tuple(tokens))


@dataclass(frozen=True, slots=True)
class CacheUse:
    """How one request's input splits, and the entries it reads and writes.

    ``read + write_5m + write_1h + uncached`` is the whole prompt.
    """

    read: int = 0
    write_5m: int = 0
    write_1h: int = 0
    uncached: int = 0
    read_key: bytes | None = None
    writes: tuple[tuple[bytes, float], ...] = field(default=())  # (key, ttl_s)

    @property
    def written(self) -> int:
        """Tokens written to the cache, at either TTL."""
        return self.write_5m + self.write_1h


@dataclass(slots=True)
class _Entry:
    expires: float
    ttl_s: float


class BreakpointCache:
    """The cached prefixes, each with its TTL and the time it expires."""

    __slots__ = ("_commits", "_entries", "_lock")

    def __init__(self) -> None:
        self._entries: dict[bytes, _Entry] = {}
        self._commits = 0
        # Real-time requests and batch lines run on the server thread; tests read from theirs.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _alive(self, key: bytes, now: float) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.expires > now

    def plan(
        self, prefix: Prefix, breakpoints: Sequence[Breakpoint], min_tokens: int, now: float
    ) -> CacheUse:
        """How a prompt would use the cache now (nothing changes until ``commit``)."""
        cacheable = [b for b in breakpoints if prefix.tokens[b.block] >= min_tokens]
        if not cacheable:
            return CacheUse(uncached=prefix.total)
        read_at = -1
        with self._lock:
            for mark in cacheable:
                stop = max(-1, mark.block - LOOKBACK_BLOCKS - 1)
                for i in range(mark.block, stop, -1):
                    if i <= read_at:
                        break
                    if prefix.tokens[i] >= min_tokens and self._alive(prefix.keys[i], now):
                        read_at = i
                        break
        read = prefix.tokens[read_at] if read_at >= 0 else 0
        later = [b for b in cacheable if b.block > read_at]
        last_1h = max((b.block for b in later if b.ttl == "1h"), default=None)
        last = max((b.block for b in later), default=None)
        write_1h = prefix.tokens[last_1h] - read if last_1h is not None else 0
        done = read + write_1h
        write_5m = prefix.tokens[last] - done if last is not None else 0
        return CacheUse(
            read=read,
            write_5m=write_5m,
            write_1h=write_1h,
            uncached=prefix.total - done - write_5m,
            read_key=prefix.keys[read_at] if read_at >= 0 else None,
            writes=tuple((prefix.keys[b.block], b.ttl_s) for b in cacheable),
        )

    def commit(self, use: CacheUse, now: float) -> None:
        """Refresh the entry read and write (or refresh) every cacheable breakpoint's."""
        with self._lock:
            if use.read_key is not None:
                entry = self._entries.get(use.read_key)
                if entry is not None:
                    entry.expires = max(entry.expires, now + entry.ttl_s)
            for key, ttl_s in use.writes:
                entry = self._entries.get(key)
                if entry is None or entry.expires <= now:
                    self._entries[key] = _Entry(now + ttl_s, ttl_s)
                else:
                    entry.ttl_s = max(entry.ttl_s, ttl_s)
                    entry.expires = max(entry.expires, now + ttl_s)
            self._commits += 1
            if self._commits % _SWEEP_EVERY == 0:
                self._entries = {k: e for k, e in self._entries.items() if e.expires > now}

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()
