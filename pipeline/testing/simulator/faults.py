"""Faults as real providers send them, beside the random ones ``engine`` draws.

A request that reliably crashes the server (``poison``: its messages hold a marker), a
prompt past the model's context window, a rate limit that does not clear and says nothing
of when it will (429 without Retry-After, in ``throttles`` windows), a key whose quota is
spent (429 ``insufficient_quota``), and the Retry-After a server may put on its 5xx
answers. Each check is a pure function of the config and the request; the engine decides
where in its steps it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .config import SimConfig
from .replies import error_body

__all__ = [
    "CONTEXT_MESSAGE",
    "QUOTA_MESSAGE",
    "ErrorReply",
    "context_refusal",
    "poison_refusal",
    "quota_refusal",
    "retry_after_headers",
    "throttle_refusal",
]

# OpenAI's wording for each; clients match on the codes, and some on the words.
CONTEXT_MESSAGE: Final = (
    "This model's maximum context length is {limit} tokens. However, you requested "
    "{total} tokens ({prompt} in the messages, {completion} in the completion). "
    "Please reduce the length of the messages or completion."
)
QUOTA_MESSAGE: Final = (
    "You exceeded your current quota, please check your plan and billing details."
)
_THROTTLE_MESSAGE: Final = (
    "Rate limit reached for sim-model on tokens per day (TPD): Limit 100000, Used 100000. "
    "(simulated: no Retry-After)"
)
_POISON_MESSAGE: Final = "The server had an error while processing your request. Sorry about that!"


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An error answer the engine sends as is: status, OpenAI's error body, log outcome."""

    status: int
    body: bytes
    outcome: str
    headers: tuple[tuple[str, str], ...] = ()


def retry_after_headers(cfg: SimConfig) -> tuple[tuple[str, str], ...]:
    """The Retry-After header a 5xx answer carries (``retry-after`` or ``retry-after-ms``)."""
    if cfg.retry_after_s is None:
        return ()
    if cfg.retry_after_unit == "ms":
        return (("retry-after-ms", f"{cfg.retry_after_s * 1000.0:g}"),)
    return (("retry-after", f"{cfg.retry_after_s:g}"),)


def throttle_refusal(cfg: SimConfig, t: float) -> ErrorReply | None:
    """A 429 without Retry-After while ``t`` (seconds since start) is in a throttle window."""
    if not any(start <= t < end for start, end in cfg.throttles):
        return None
    body = error_body(_THROTTLE_MESSAGE, "tokens", None, "rate_limit_exceeded")
    return ErrorReply(429, body, "throttled")


def quota_refusal(cfg: SimConfig, answered: int) -> ErrorReply | None:
    """OpenAI's 429 ``insufficient_quota`` once the key's quota of answers is spent."""
    if cfg.quota_requests is None or answered < cfg.quota_requests:
        return None
    body = error_body(QUOTA_MESSAGE, "insufficient_quota", None, "insufficient_quota")
    return ErrorReply(429, body, "quota")


def context_refusal(
    cfg: SimConfig, prompt_tokens: int, max_tokens: int | None
) -> ErrorReply | None:
    """OpenAI's 400 ``context_length_exceeded`` for a request past ``context_limit`` tokens."""
    limit = cfg.context_limit
    completion = max_tokens or 0
    if limit is None or prompt_tokens + completion <= limit:
        return None
    message = CONTEXT_MESSAGE.format(
        limit=limit, total=prompt_tokens + completion, prompt=prompt_tokens, completion=completion
    )
    body = error_body(message, "invalid_request_error", "messages", "context_length_exceeded")
    return ErrorReply(400, body, "context_length")


def poison_refusal(cfg: SimConfig, texts: Sequence[str]) -> ErrorReply | None:
    """The crash a poisoned request always meets (its messages hold ``cfg.poison``)."""
    if not cfg.poison or not any(cfg.poison in text for text in texts):
        return None
    body = error_body(_POISON_MESSAGE, "server_error")
    return ErrorReply(cfg.poison_status, body, "poison", retry_after_headers(cfg))
