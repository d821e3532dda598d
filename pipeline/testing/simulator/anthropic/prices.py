"""Claude models as the bill knows them: prices and the minimum cacheable prefix.

Prices are Anthropic's published list prices in dollars per million tokens (the "Model
pricing" table of https://platform.claude.com/docs/en/about-claude/pricing): cache writes
cost 1.25 times the input price for the 5-minute TTL and 2 times for the 1-hour TTL, cache
reads 0.1 times, and Message Batches half of everything (``SimConfig.batch_discount``),
cache writes and reads included. The minimum cacheable prefix per model is the prompt
caching page's (https://platform.claude.com/docs/en/build-with-claude/prompt-caching, as
quoted in anthropics/anthropic-sdk-python issue #1194); ``SimConfig.cache_min_tokens``
replaces it for every model.

A model the table does not know (``sim-model``) is billed at ``SimConfig.price_input`` and
``price_output`` with the same multipliers, and caches prefixes of 1,024 tokens or more.
Model ids are matched without their date suffix (``claude-sonnet-4-5-20250929`` is
``claude-sonnet-4-5``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from ..config import SimConfig
from ..tiers import Charge
from .caching import CacheUse

__all__ = [
    "CACHE_READ_FACTOR",
    "CACHE_WRITE_FACTORS",
    "DEFAULT_MIN_CACHE_TOKENS",
    "MODELS",
    "ModelCard",
    "Usage",
    "charge",
    "min_cache_tokens",
    "model_card",
]

CACHE_WRITE_FACTORS: Final = {"5m": 1.25, "1h": 2.0}
CACHE_READ_FACTOR: Final = 0.1
DEFAULT_MIN_CACHE_TOKENS: Final = 1024
_DATE: Final = re.compile(r"-\d{8}$")


@dataclass(frozen=True, slots=True)
class ModelCard:
    """One model's list prices (dollars per million tokens) and minimum cacheable prefix."""

    input: float
    output: float
    min_cache_tokens: int


_OPUS_45: Final = ModelCard(5.0, 25.0, 4096)
_OPUS_4: Final = ModelCard(15.0, 75.0, 1024)
_SONNET_4: Final = ModelCard(3.0, 15.0, 1024)
MODELS: Final[dict[str, ModelCard]] = {
    "claude-opus-4-6": _OPUS_45,
    "claude-opus-4-5": _OPUS_45,
    "claude-opus-4-1": _OPUS_4,
    "claude-opus-4-0": _OPUS_4,
    "claude-opus-4": _OPUS_4,
    "claude-sonnet-4-6": _SONNET_4,
    "claude-sonnet-4-5": _SONNET_4,
    "claude-sonnet-4-0": _SONNET_4,
    "claude-sonnet-4": _SONNET_4,
    "claude-haiku-4-5": ModelCard(1.0, 5.0, 4096),
}


def model_card(cfg: SimConfig, model: str) -> ModelCard:
    """The card of ``model``: the table's, else the configured prices."""
    known = MODELS.get(_DATE.sub("", model))
    if known is not None:
        return known
    return ModelCard(cfg.price_input, cfg.price_output, DEFAULT_MIN_CACHE_TOKENS)


def min_cache_tokens(cfg: SimConfig, model: str) -> int:
    """The shortest prefix ``model`` caches (``cfg.cache_min_tokens`` when set)."""
    if cfg.cache_min_tokens is not None:
        return cfg.cache_min_tokens
    return model_card(cfg, model).min_cache_tokens


@dataclass(frozen=True, slots=True)
class Usage:
    """An answer's tokens as Anthropic reports them: input split by cache use, and output."""

    cache: CacheUse
    output_tokens: int

    @property
    def input_tokens(self) -> int:
        """Input tokens neither read from nor written to the cache."""
        return self.cache.uncached

    @property
    def total_input(self) -> int:
        """Every input token: uncached, written and read."""
        return self.cache.uncached + self.cache.written + self.cache.read

    def to_json(self, tier: str) -> dict[str, object]:
        """The ``usage`` object of a Message (``tier``: "standard" or "batch")."""
        cache = self.cache
        return {
            "input_tokens": cache.uncached,
            "cache_creation_input_tokens": cache.written,
            "cache_read_input_tokens": cache.read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": cache.write_5m,
                "ephemeral_1h_input_tokens": cache.write_1h,
            },
            "output_tokens": self.output_tokens,
            "service_tier": tier,
        }


def charge(cfg: SimConfig, model: str, usage: Usage, *, batch: bool) -> Charge:
    """What one answer costs at ``model``'s prices (half of it on a batch line)."""
    card = model_card(cfg, model)
    cache = usage.cache
    dollars = (
        cache.uncached * card.input
        + cache.write_5m * card.input * CACHE_WRITE_FACTORS["5m"]
        + cache.write_1h * card.input * CACHE_WRITE_FACTORS["1h"]
        + cache.read * card.input * CACHE_READ_FACTOR
        + usage.output_tokens * card.output
    ) / 1e6
    factor = cfg.batch_discount if batch else 1.0
    return Charge(
        model=model,
        tier="batch" if batch else "default",
        prompt_tokens=usage.total_input,
        cached_tokens=cache.read,
        completion_tokens=usage.output_tokens,
        usd=dollars * factor,
        cache_write_5m_tokens=cache.write_5m,
        cache_write_1h_tokens=cache.write_1h,
        provider="anthropic",
    )
