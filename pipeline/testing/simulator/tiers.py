"""Service tiers and the server's own bill.

A request may name ``service_tier``: ``flex`` is answered more slowly
(``flex_slowdown`` times the latency), a share of flex requests (``p_flex_unavailable``)
is refused with 429 ``resource_unavailable`` (never billed), and what flex serves is
billed at the batch rate; ``default`` and ``priority`` are echoed, ``auto`` is served as
``default``. Every answer says the tier that served it.

The bill is the server's accounting of what each answer costs: prompt tokens not served
from cache at the input price, cached ones at the cached price, completion tokens at the
output price, times the tier's factor (flex and Batch API lines at ``batch_discount``).
Anthropic's answers are billed by its own rules (``anthropic.prices``) and carry their
cache writes. Tests compare it with the dollars a run reports.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any, Final

from .config import SimConfig
from .faults import ErrorReply
from .replies import error_body

__all__ = [
    "FLEX_UNAVAILABLE_MESSAGE",
    "TIERS",
    "Bill",
    "Charge",
    "flex_refusal",
    "served_tier",
    "tier_factor",
]

TIERS: Final = ("auto", "default", "flex", "priority")
FLEX_UNAVAILABLE_MESSAGE: Final = (
    "Resource unavailable: there is not enough capacity to serve this flex request right "
    "now. Please retry later, or use the default service tier."
)


def served_tier(requested: str | None) -> str:
    """The tier that serves a request asking for ``requested`` (None: the default)."""
    if requested in (None, "auto"):
        return "default"
    return requested


def flex_refusal(cfg: SimConfig, tier: str, draw: float) -> ErrorReply | None:
    """The 429 ``resource_unavailable`` a flex request meets when ``draw`` says so."""
    if tier != "flex" or draw >= cfg.p_flex_unavailable:
        return None
    unavailable = "resource_unavailable"
    body = error_body(FLEX_UNAVAILABLE_MESSAGE, unavailable, None, unavailable)
    return ErrorReply(429, body, "flex_unavailable")


def tier_factor(cfg: SimConfig, tier: str) -> float:
    """What a tier's tokens cost, as a factor of the standard prices."""
    if tier in ("flex", "batch"):
        return cfg.batch_discount
    if tier == "priority":
        return cfg.priority_factor
    return 1.0


@dataclass(frozen=True, slots=True)
class Charge:
    """One answer on the bill."""

    model: str
    tier: str  # default, flex, priority, or batch (a Batch API or Message Batches line)
    prompt_tokens: int  # every input token, those read from and written to the cache included
    cached_tokens: int  # read from the cache
    completion_tokens: int
    usd: float
    # Written to Anthropic's cache, by TTL (OpenAI's cache writes are not billed).
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    provider: str = "openai"  # the API that answered: openai or anthropic


class Bill:
    """Every answer's charge (written on the server's thread, read from the tests')."""

    __slots__ = ("_charges", "_lock")

    def __init__(self) -> None:
        self._charges: list[Charge] = []
        self._lock = threading.Lock()

    def charge(
        self, cfg: SimConfig, model: str, tier: str, prompt: int, cached: int, completion: int
    ) -> Charge:
        """Bill one answer at the configured prices."""
        usd = (
            (prompt - cached) * cfg.price_input
            + cached * cfg.price_cached_input
            + completion * cfg.price_output
        ) / 1e6
        return self.add(
            Charge(model, tier, prompt, cached, completion, usd * tier_factor(cfg, tier))
        )

    def add(self, entry: Charge) -> Charge:
        """Put one answer's charge on the bill."""
        with self._lock:
            self._charges.append(entry)
        return entry

    def charges(self) -> list[Charge]:
        """A snapshot of the charges so far."""
        with self._lock:
            return list(self._charges)

    def total_usd(self) -> float:
        """Dollars billed so far."""
        return sum(c.usd for c in self.charges())

    def clear(self) -> None:
        """Start a new bill."""
        with self._lock:
            self._charges.clear()

    def to_json(self) -> dict[str, Any]:
        """``GET /v1/sim/bill``: the total, the tokens by type, and the charges by tier."""
        charges = self.charges()
        tiers: dict[str, dict[str, float]] = {}
        for c in charges:
            t = tiers.setdefault(c.tier, {"answers": 0, "usd": 0.0})
            t["answers"] += 1
            t["usd"] += c.usd
        return {
            "total_usd": sum(c.usd for c in charges),
            "answers": len(charges),
            "prompt_tokens": sum(c.prompt_tokens for c in charges),
            "cached_tokens": sum(c.cached_tokens for c in charges),
            "cache_write_5m_tokens": sum(c.cache_write_5m_tokens for c in charges),
            "cache_write_1h_tokens": sum(c.cache_write_1h_tokens for c in charges),
            "completion_tokens": sum(c.completion_tokens for c in charges),
            "tiers": tiers,
            "charges": [asdict(c) for c in charges],
        }
