"""The simulator's settings: one frozen value, swappable at runtime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .answerkey import AnswerKey

__all__ = [
    "BATCH_ENDPOINT",
    "DEFAULT_MODEL",
    "FAULTS",
    "MESSAGES_FAULTS",
    "STRUCTURED_LEVELS",
    "SimConfig",
]

STRUCTURED_LEVELS: Final = ("json_schema", "json_object", "none")
DEFAULT_MODEL: Final = "sim-model"
BATCH_ENDPOINT: Final = "/v1/chat/completions"
# Real-time faults, in the fixed order their random draws are taken (reproducibility).
FAULTS: Final = ("p_500", "p_503", "p_hang", "p_reset", "p_truncate", "p_length", "p_refusal")
# The same for Anthropic's Messages API (its own random stream): 500 api_error, 529
# overloaded_error, 429 rate_limit_error, then the transport faults and the answers cut at
# max_tokens or refused.
MESSAGES_FAULTS: Final = (
    "p_500",
    "p_529",
    "p_429",
    "p_hang",
    "p_reset",
    "p_truncate",
    "p_length",
    "p_refusal",
)
_PROBABILITIES: Final = (
    "p_done",
    "p_right",
    *FAULTS,
    "p_429",
    "p_529",
    "p_line_fail",
    "p_batch_expire",
    "expire_fraction",
    "p_flex_unavailable",
)
_DURATIONS: Final = (
    "latency_s",
    "jitter_s",
    "hang_s",
    "batch_validating_s",
    "batch_delay_s",
    "batch_finalizing_s",
    "cache_ttl_s",
)
_NON_NEGATIVE: Final = (
    "price_input",
    "price_cached_input",
    "price_output",
    "batch_discount",
    "priority_factor",
)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Behaviour of the simulated server (swap it at runtime with ``Simulator.set_config``).

    Batch settings are read when a batch is created, except the two limits
    (``batch_token_limit``, ``batch_max_in_progress``), which hold at every check.
    """

    latency_s: float = 0.0
    jitter_s: float = 0.0
    p_done: float = 0.3
    seed: int = 0
    api_key: str | None = None
    models: tuple[str, ...] | None = None
    structured: str = "json_schema"
    fence_json: bool = False
    rpm: float | None = None
    tpm: float | None = None
    p_500: float = 0.0
    p_503: float = 0.0
    p_hang: float = 0.0
    hang_s: float = 3600.0
    p_reset: float = 0.0
    p_truncate: float = 0.0
    p_length: float = 0.0
    p_refusal: float = 0.0
    outages: tuple[tuple[float, float], ...] = ()
    faults_seed: int = 0
    # Faults as real providers send them (see ``faults``): a Retry-After on every 5xx
    # answer, in seconds (``retry_after_unit`` "s") or milliseconds ("ms"); a marker that
    # makes any request holding it fail with ``poison_status``; a context window (prompt
    # plus max_tokens); windows answering 429 without Retry-After; the answers a key's
    # quota covers before 429 ``insufficient_quota``.
    retry_after_s: float | None = None
    retry_after_unit: str = "s"
    poison: str | None = None
    poison_status: int = 500
    context_limit: int | None = None
    throttles: tuple[tuple[float, float], ...] = ()
    quota_requests: int | None = None
    # Batch API: seconds spent validating, in progress (the completion delay) and finalizing.
    batch_validating_s: float = 0.05
    batch_delay_s: float = 0.2
    batch_finalizing_s: float = 0.05
    # A failed line answers with one of these statuses, chosen per line.
    p_line_fail: float = 0.0
    line_fail_statuses: tuple[int, ...] = (500, 429, 400)
    # An expiring batch finishes ``expire_fraction`` of its lines, then expires.
    p_batch_expire: float = 0.0
    expire_fraction: float = 0.5
    batch_shuffle: bool = True
    batch_max_requests: int = 50_000
    batch_max_bytes: int = 200 * 1024 * 1024
    # Enqueued tokens per model (prompt estimate + max tokens over batches in flight).
    batch_token_limit: int | None = None
    batch_max_in_progress: int | None = None
    # OpenAI's prefix cache (see ``caching``): prompts of 1,024 tokens or more; entries
    # live ``cache_ttl_s`` after their last use. ``accept_cache_key`` False answers a
    # request naming ``prompt_cache_key`` with 400 (a server that does not know it).
    prefix_cache: bool = True
    cache_ttl_s: float = 300.0
    accept_cache_key: bool = True
    # The flex tier (see ``tiers``): answered ``flex_slowdown`` times slower, a share
    # refused with 429 resource_unavailable.
    flex_slowdown: float = 2.0
    p_flex_unavailable: float = 0.0
    # The bill: dollars per million tokens, and the factors of the other tiers (flex and
    # Batch API lines at ``batch_discount``).
    price_input: float = 1.0
    price_cached_input: float = 0.25
    price_output: float = 4.0
    batch_discount: float = 0.5
    priority_factor: float = 2.0
    # A model that knows some answers (see ``answerkey``): a text request about a question
    # of ``answer_key`` gets a program returning the right number with probability
    # ``p_right`` on a first draft and ``p_right_refined`` (None: ``p_right``) on a
    # refinement, else a wrong one.
    answer_key: AnswerKey | None = None
    p_right: float = 0.5
    p_right_refined: float | None = None

    @property
    def right_when_refined(self) -> float:
        """The probability that a refinement about a known question is right."""
        return self.p_right if self.p_right_refined is None else self.p_right_refined

    # Anthropic's Messages API (see ``anthropic``). ``rpm`` limits its requests too (a bucket
    # of its own); ``itpm`` and ``otpm`` its input and output tokens per minute, separately.
    # ``p_429`` and ``p_529`` are faults only it sends (429 rate_limit_error, 529
    # overloaded_error; ``p_503`` stays OpenAI's). ``cache_min_tokens`` replaces every
    # model's documented minimum cacheable prefix. Message Batches take at most
    # ``message_batch_max_requests`` requests and ``message_batch_max_bytes`` of body.
    itpm: float | None = None
    otpm: float | None = None
    p_429: float = 0.0
    p_529: float = 0.0
    cache_min_tokens: int | None = None
    message_batch_max_requests: int = 100_000
    message_batch_max_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.structured not in STRUCTURED_LEVELS:
            raise ValueError(
                f"structured must be one of {STRUCTURED_LEVELS}, not {self.structured!r}"
            )
        for name in _PROBABILITIES:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], not {value!r}")
        for name in (*_DURATIONS, *_NON_NEGATIVE):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, not {getattr(self, name)!r}")
        if self.flex_slowdown < 1:
            raise ValueError(f"flex_slowdown must be at least 1, not {self.flex_slowdown!r}")
        for name in ("rpm", "tpm", "itpm", "otpm"):
            limit = getattr(self, name)
            if limit is not None and not limit > 0:
                raise ValueError(f"{name} must be positive when set, not {limit!r}")
        for window in (*self.outages, *self.throttles):
            if len(window) != 2 or window[1] < window[0]:
                raise ValueError(f"windows are (start_s, end_s) pairs, not {window!r}")
        self._check_real_faults()
        if not 0.0 <= self.right_when_refined <= 1.0:
            raise ValueError(f"p_right_refined must be within [0, 1], not {self.p_right_refined!r}")
        if not self.line_fail_statuses or any(not 400 <= s <= 599 for s in self.line_fail_statuses):
            raise ValueError(
                f"line_fail_statuses must be HTTP error statuses, not {self.line_fail_statuses!r}"
            )
        for name in (
            "batch_max_requests",
            "batch_max_bytes",
            "message_batch_max_requests",
            "message_batch_max_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)!r}")
        for name in ("batch_token_limit", "batch_max_in_progress"):
            limit = getattr(self, name)
            if limit is not None and limit < 1:
                raise ValueError(f"{name} must be at least 1 when set, not {limit!r}")

    def _check_real_faults(self) -> None:
        if self.retry_after_s is not None and self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must not be negative, not {self.retry_after_s!r}")
        if self.retry_after_unit not in ("s", "ms"):
            raise ValueError(f"retry_after_unit must be 's' or 'ms', not {self.retry_after_unit!r}")
        if not 500 <= self.poison_status <= 599:
            raise ValueError(f"poison_status must be a 5xx status, not {self.poison_status!r}")
        for name in ("context_limit", "quota_requests", "cache_min_tokens"):
            limit = getattr(self, name)
            if limit is not None and limit < 0:
                raise ValueError(f"{name} must not be negative, not {limit!r}")
