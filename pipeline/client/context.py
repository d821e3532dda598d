"""Context windows: a prompt that cannot fit its model's window is never sent.

``CONTEXT_WINDOWS`` holds the windows (prompt and answer together, in tokens) of the
models the price table knows, as OpenAI publishes them; the embedded model's window is
its server's slot, and ``--context-tokens`` gives any other model's (or overrides these).

Whether a prompt fits is decided by a lower bound on its tokens, so that no prompt that
fits is ever refused whatever the tokenizer: the tokenizers of OpenAI's models, Llama,
Qwen and Mistral never make one token of text on both sides of whitespace, so a prompt
holds at least as many tokens as it has whitespace-separated words (and one per message
for the role). English prose runs about 1.3 tokens a word and code more, so a prompt is
refused only once it is well past the window: a record ten times too long is caught, one
a few percent too long is sent and the server's refusal fails its call at once (no retry
and no other response format is tried; see ``formats``). ``estimate_tokens``, the
project's usual (upper-leaning) estimate, is what the refusal shows as the prompt's size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import CallError
from .limits import estimate_tokens
from .prices import model_family

__all__ = [
    "CONTEXT_LENGTH",
    "CONTEXT_WINDOWS",
    "context_window",
    "least_tokens",
    "overflow",
]

CONTEXT_LENGTH = "context_length"  # the error type of a call refused for its length
# Tokens of prompt and answer together, as openai.com listed them on the day the price
# table was checked (prices.PRICES_AS_OF).
CONTEXT_WINDOWS: Mapping[str, int] = {
    "gpt-4o-mini": 128_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "gpt-5": 400_000,
    "gpt-5-mini": 400_000,
    "gpt-5-nano": 400_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    "gpt-3.5-turbo": 16_385,
}


def context_window(model: str) -> int | None:
    """The context window of ``model`` (a dated snapshot: its family's), or None."""
    return CONTEXT_WINDOWS.get(model) or CONTEXT_WINDOWS.get(model_family(model))


def least_tokens(messages: Sequence[Mapping[str, str]]) -> int:
    """A lower bound on the prompt tokens of ``messages``: one per whitespace-separated word
    and one per message."""
    return sum(1 + len((m.get("content") or "").split()) for m in messages)


def overflow(messages: Sequence[Mapping[str, str]], window: int, model: str) -> CallError | None:
    """The error of a call whose prompt cannot fit ``window`` tokens, or None when it may.

    Cheap for prompts that fit: words are counted only when the text alone could exceed
    the window (a token is at least one character).
    """
    chars = sum(len(m.get("content") or "") for m in messages)
    if chars + len(messages) < window:
        return None
    least = least_tokens(messages)
    if least < window:  # at least one token must be left for the answer
        return None
    return CallError(
        CONTEXT_LENGTH,
        f"the prompt holds at least {least:,} tokens (about {estimate_tokens(messages):,}), "
        f"more than the {window:,}-token context window of {model} (--context-tokens sets "
        "it); not sent",
        attempts=0,
        messages=[dict(m) for m in messages],
        model=model,
    )
