"""The simulator's faults (``SimConfig``'s, as ``faults`` sends them for OpenAI), in
Anthropic's words and statuses.

- ``outages``: 529 ``overloaded_error`` (Anthropic's "temporarily overloaded").
- ``throttles``: 429 ``rate_limit_error`` without ``retry-after``.
- ``quota_requests`` spent: 400 ``invalid_request_error``, credit balance too low.
- ``context_limit``: 400 "prompt is too long" (or prompt plus ``max_tokens`` too long).
- ``poison``: ``poison_status`` with ``api_error``, every time.
- drawn per request (``MESSAGES_FAULTS``): ``p_500`` 500 ``api_error``, ``p_529`` 529
  ``overloaded_error``, ``p_429`` 429 ``rate_limit_error`` with ``retry-after``, then
  ``p_hang`` and ``p_reset``.

5xx answers carry ``retry_after_s`` when it is set (``faults.retry_after_headers``); a
drawn 429 always says when to retry (``retry_after_s``, else one second).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ..config import SimConfig
from ..faults import ErrorReply, retry_after_headers
from .errors import error_body

__all__ = [
    "CREDIT_MESSAGE",
    "context_refusal",
    "drawn_fault",
    "outage_refusal",
    "poison_refusal",
    "quota_refusal",
    "throttle_refusal",
]

CREDIT_MESSAGE: Final = (
    "Your credit balance is too low to access the Anthropic API. Please go to Plans & "
    "Billing to upgrade or purchase credits."
)
_OVERLOADED: Final = "Overloaded"
_INTERNAL: Final = "Internal server error"


def _retry_429(cfg: SimConfig) -> tuple[tuple[str, str], ...]:
    return retry_after_headers(cfg) if cfg.retry_after_s is not None else (("retry-after", "1"),)


def outage_refusal(cfg: SimConfig, t: float, request_id: str) -> ErrorReply | None:
    """529 while ``t`` (seconds since start) is in an outage window."""
    if not any(start <= t < end for start, end in cfg.outages):
        return None
    body = error_body(529, _OVERLOADED, request_id)
    return ErrorReply(529, body, "outage", retry_after_headers(cfg))


def throttle_refusal(cfg: SimConfig, t: float, request_id: str) -> ErrorReply | None:
    """A 429 without ``retry-after`` while ``t`` is in a throttle window."""
    if not any(start <= t < end for start, end in cfg.throttles):
        return None
    message = "Number of request tokens has exceeded your daily rate limit (simulated)."
    return ErrorReply(429, error_body(429, message, request_id), "throttled")


def quota_refusal(cfg: SimConfig, answered: int, request_id: str) -> ErrorReply | None:
    """400, credit balance too low, once ``quota_requests`` answers were given."""
    if cfg.quota_requests is None or answered < cfg.quota_requests:
        return None
    return ErrorReply(400, error_body(400, CREDIT_MESSAGE, request_id), "quota")


def context_refusal(
    cfg: SimConfig, prompt_tokens: int, max_tokens: int, request_id: str
) -> ErrorReply | None:
    """400 when the prompt, or the prompt plus ``max_tokens``, exceeds ``context_limit``."""
    limit = cfg.context_limit
    if limit is None or prompt_tokens + max_tokens <= limit:
        return None
    if prompt_tokens > limit:
        message = f"prompt is too long: {prompt_tokens} tokens > {limit} maximum"
    else:
        message = (
            f"input length and `max_tokens` exceed context limit: {prompt_tokens} + "
            f"{max_tokens} > {limit}, decrease input length or `max_tokens` and try again"
        )
    return ErrorReply(400, error_body(400, message, request_id), "context_length")


def poison_refusal(cfg: SimConfig, texts: Sequence[str], request_id: str) -> ErrorReply | None:
    """The crash a request holding ``cfg.poison`` always meets."""
    if not cfg.poison or not any(cfg.poison in text for text in texts):
        return None
    body = error_body(cfg.poison_status, _INTERNAL, request_id)
    return ErrorReply(cfg.poison_status, body, "poison", retry_after_headers(cfg))


def drawn_fault(cfg: SimConfig, draws: Sequence[float], request_id: str) -> ErrorReply | None:
    """The fault the draws (in ``MESSAGES_FAULTS`` order) pick, if any; a hang or a reset
    has status 0 and an outcome naming it."""
    if draws[0] < cfg.p_500:
        body = error_body(500, _INTERNAL, request_id)
        return ErrorReply(500, body, "error_500", retry_after_headers(cfg))
    if draws[1] < cfg.p_529:
        body = error_body(529, _OVERLOADED, request_id)
        return ErrorReply(529, body, "error_529", retry_after_headers(cfg))
    if draws[2] < cfg.p_429:
        message = "This request would exceed your organization's rate limit (simulated)."
        return ErrorReply(429, error_body(429, message, request_id), "error_429", _retry_429(cfg))
    if draws[3] < cfg.p_hang:
        return ErrorReply(0, b"", "hang")
    if draws[4] < cfg.p_reset:
        return ErrorReply(0, b"", "reset")
    return None
