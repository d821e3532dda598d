"""How the embedded server reuses a record's prompt: the prompt cache settings of ``llama-server``.

A record's calls form one conversation (``core.prompts``): each call's messages extend the
previous call's, so the tokens of a call that ``llama-server`` has already computed are a
prefix of the next call's. The server keeps them two ways:

- in a slot: a request compares its tokens with each idle slot's and goes to the one
  sharing the largest part of it (``--slot-prompt-similarity``, llama.cpp's default 0.1);
  only the tokens after the common prefix are computed (``--cache-prompt``, passed
  explicitly so a build whose default differs still reuses);
- in host memory (``--cache-ram``): a slot taken by another record's call first saves its
  tokens' state there, and a request that lands on a slot holding less of its prefix
  loads its own saved state back. With more records in flight than slots, a record's
  conversation waits there between its calls.

Slots are not pinned to records (``id_slot``): a call would wait for its record's slot
while others stand idle, and the host cache already brings its prefix to any slot. The
host cache is capped well below llama.cpp's default of 8 GiB (docs/local.md says why and
what it holds): ``REFINE_LOCAL_CACHE_MIB`` sets another cap, ``0`` turns it off.
"""

from __future__ import annotations

from typing import Final

from .environ import env_count

__all__ = ["CACHE_MIB_ENV", "DEFAULT_CACHE_MIB", "cache_args", "cache_mib"]

CACHE_MIB_ENV: Final = "REFINE_LOCAL_CACHE_MIB"
DEFAULT_CACHE_MIB: Final = 2048
"""Host memory for saved prompts, MiB. The oldest saved prompt goes first once it is full;
docs/local.md has what it holds per model."""


def cache_mib() -> int:
    """The host prompt cache's cap in MiB: ``$REFINE_LOCAL_CACHE_MIB``, else the default."""
    expected = "a size in MiB (0 turns the cache off)"
    return env_count(CACHE_MIB_ENV, DEFAULT_CACHE_MIB, least=0, expected=expected)


def cache_args(mib: int | None = None) -> list[str]:
    """The server flags that keep and reuse computed prompts, the host cache capped at
    ``mib`` (the configured cap when None)."""
    return ["--cache-prompt", "--cache-ram", str(cache_mib() if mib is None else mib)]
