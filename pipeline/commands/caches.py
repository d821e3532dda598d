"""How a provider's prompt cache would serve the loop's prompts, for ``refine estimate``.

Two rules: OpenAI's automatic prefix cache (a prompt of ``CACHE_MIN_TOKENS`` or more reads
the longest prefix it shares with a prompt sent before, in steps of ``CACHE_STEP``; writes
are free) and Anthropic's breakpoints (``client.anthropic.messages``: every call marks the
end of its prompt, so it reads the prefix an earlier call marked and writes the rest, each
only from the model's minimum on; the feedback's format or forced tool keys the cache
apart, so such a feedback call reads only what an earlier one like it wrote).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..client.anthropic.messages import min_cache_tokens
from ..client.limits import estimate_tokens
from ..client.models import ModelId

__all__ = [
    "CACHE_MIN_TOKENS",
    "CACHE_STEP",
    "cache_usage",
    "cacheable",
    "shared_tokens",
    "written_usage",
]

# OpenAI's prefix cache: prompts from this many tokens on, served in steps of CACHE_STEP.
CACHE_MIN_TOKENS = 1024
CACHE_STEP = 128


def cacheable(shared: int) -> int:
    """The prompt tokens a provider serves from cache for a prefix of ``shared`` tokens
    already seen (OpenAI's rule: none below CACHE_MIN_TOKENS, then in CACHE_STEP steps)."""
    if shared < CACHE_MIN_TOKENS:
        return 0
    return shared - (shared - CACHE_MIN_TOKENS) % CACHE_STEP


def written_usage(prompt: int, shared: int, model: str, ttl: str | None) -> dict[str, int]:
    """A call's prompt split as a cache with breakpoints bills it (Anthropic's): the prefix
    it shares with an earlier call, read when it holds the model's minimum; the rest
    written, when the prompt holds that minimum (every call marks its own end)."""
    least = min_cache_tokens(model)
    read = min(shared, prompt) if shared >= least else 0
    written = prompt - read if prompt >= least else 0
    return {
        "prompt_tokens": prompt,
        "cached_tokens": read,
        "cache_write_tokens": written,
        "cache_write_1h_tokens": written if ttl == "1h" else 0,
    }


def cache_usage(
    sent: Sequence[Mapping[str, str]],
    model: str,
    formatted: bool,
    seen: list[str],
    ttl: str | None,
) -> dict[str, int]:
    """The prompt usage of one call of ``model`` (cache reads and, where the provider bills
    them, writes), given ``seen``, the prompts sent before, to which this one is added.
    ``formatted``: a feedback call whose format the request asks for apart from its text."""
    flat = "".join(f"\x00{m['role']}\x00{m['content']}" for m in sent)
    prompt = estimate_tokens(sent)
    if ModelId.parse(model).provider.writes_cache:
        if formatted:
            flat = "\x01format" + flat  # Anthropic keys its cache on the format too
        usage = written_usage(prompt, shared_tokens(flat, seen), model, ttl)
    else:
        usage = {
            "prompt_tokens": prompt,
            "cached_tokens": min(prompt, cacheable(shared_tokens(flat, seen))),
        }
    seen.append(flat)
    return usage


def shared_tokens(text: str, seen: Sequence[str]) -> int:
    """Tokens of the longest prefix ``text`` shares with a prompt sent before."""
    best = max((_common(text, before) for before in seen), default=0)
    return best // 4  # estimate_tokens' four characters a token


def _common(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (slices compare in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low
