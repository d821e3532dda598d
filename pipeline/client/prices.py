"""Prices: dollars per million tokens by model, and the cost of the calls a run made.

The built-in table holds OpenAI's and Anthropic's published list prices for common models.
Providers change prices: ``--prices FILE`` (JSON or TOML, model name -> ``{input, output}``
and optionally ``cached_input``, ``cache_write``, ``cache_write_1h`` and ``batch``)
overrides and extends it. Models served by the embedded local model (``local:NAME``) cost
nothing. A model with no price has an unknown cost, shown as such, never guessed. A
provider's model (``anthropic:claude-sonnet-4-6``) is found under its written id first,
then under its bare name (``claude-sonnet-4-6``), which is how the table keys it.

A call's usage splits its prompt tokens (``prompt_tokens``, all of them) into those the
provider served from its cache (``cached_tokens``: the ``cached_input`` rate), those it
wrote to its cache (``cache_write_tokens``, Anthropic's explicit cache; of them,
``cache_write_1h_tokens`` at the one-hour TTL: the ``cache_write_1h`` rate, the rest the
``cache_write`` rate) and the rest (the ``input`` rate). Calls made through a batch API
(OpenAI's Batch API, Anthropic's Message Batches), and those the flex tier served, cost the
model's ``batch`` factor of all of it (OpenAI bills flex at Batch API rates; Anthropic
halves cache reads and writes in batches too).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..core.steps import Step
from ..errors import ConfigError
from .flex import FLEX
from .models import ModelId

__all__ = [
    "ANTHROPIC_PRICES_AS_OF",
    "BATCH_DISCOUNT",
    "BUILTIN",
    "CACHE_READ_FACTOR",
    "CACHE_WRITE_1H_FACTOR",
    "CACHE_WRITE_FACTOR",
    "PRICES_AS_OF",
    "Price",
    "PriceBook",
    "at_batch_rate",
    "claude",
    "load_prices",
    "model_family",
    "price_book",
]

# The Batch API bills half the real-time price for every model it serves (and so does the
# flex tier, for the models it serves).
BATCH_DISCOUNT = 0.5
PRICES_AS_OF = "2025-08-15"  # when the table below was checked against openai.com/api/pricing
# when the Claude prices below were checked against platform.claude.com/docs/en/about-claude/pricing
ANTHROPIC_PRICES_AS_OF = "2026-02-17"
# Anthropic's cache prices, as factors of a model's input price: a write for 5 minutes, a
# write for an hour, a read. A price file that names a model's input price but not these
# gets them (no other provider reports cache writes).
CACHE_WRITE_FACTOR = 1.25
CACHE_WRITE_1H_FACTOR = 2.0
CACHE_READ_FACTOR = 0.1


def at_batch_rate(batch_id: object, service_tier: object) -> bool:
    """Whether a call is billed at the batch rate: sent through the Batch API, or served
    by the flex tier."""
    return batch_id is not None or service_tier == FLEX


@dataclass(frozen=True, slots=True)
class Price:
    """Dollars per million tokens."""

    input: float
    output: float
    cached_input: float | None = None  # prompt tokens served from the provider's cache
    batch: float = BATCH_DISCOUNT  # factor for calls through a batch API or on the flex tier
    cache_write: float | None = None  # prompt tokens written to the cache for 5 minutes
    cache_write_1h: float | None = None  # ... for an hour

    @property
    def write_rate(self) -> float:
        """Dollars per million tokens written to the cache for 5 minutes."""
        return self.input * CACHE_WRITE_FACTOR if self.cache_write is None else self.cache_write

    @property
    def write_1h_rate(self) -> float:
        """Dollars per million tokens written to the cache for an hour."""
        if self.cache_write_1h is None:
            return self.input * CACHE_WRITE_1H_FACTOR
        return self.cache_write_1h

    def cost(self, usage: Mapping[str, int], *, batch: bool = False) -> float:
        """Dollars for one call's usage."""
        prompt = int(usage.get("prompt_tokens", 0))
        cached = min(int(usage.get("cached_tokens", 0)), prompt)
        written = min(int(usage.get("cache_write_tokens", 0)), prompt - cached)
        long = min(int(usage.get("cache_write_1h_tokens", 0)), written)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        dollars = (
            (prompt - cached - written) * self.input
            + cached * cached_rate
            + (written - long) * self.write_rate
            + long * self.write_1h_rate
            + int(usage.get("completion_tokens", 0)) * self.output
        ) / 1e6
        return dollars * (self.batch if batch else 1.0)

    def worst_case(
        self, prompt: int, completion: int, *, batch: bool = False, writes: bool = False
    ) -> float:
        """The most a call of ``prompt`` and ``completion`` tokens can cost: its prompt at the
        dearest input rate (``writes``: a cache write, where the provider bills them)."""
        rates = [self.input]
        if writes:
            rates += [self.write_rate, self.write_1h_rate]
        dollars = (prompt * max(rates) + completion * self.output) / 1e6
        return dollars * (self.batch if batch else 1.0)


def claude(input_usd: float, output_usd: float) -> Price:
    """A Claude model's price from its input and output prices (Anthropic's cache factors)."""
    return Price(
        input_usd,
        output_usd,
        round(input_usd * CACHE_READ_FACTOR, 6),
        BATCH_DISCOUNT,
        round(input_usd * CACHE_WRITE_FACTOR, 6),
        round(input_usd * CACHE_WRITE_1H_FACTOR, 6),
    )


# input, output, cached input; USD per million tokens, standard tier, as of PRICES_AS_OF.
BUILTIN: Mapping[str, Price] = {
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "gpt-4o": Price(2.50, 10.00, 1.25),
    "gpt-4.1": Price(2.00, 8.00, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "gpt-5": Price(1.25, 10.00, 0.125),
    "gpt-5-mini": Price(0.25, 2.00, 0.025),
    "gpt-5-nano": Price(0.05, 0.40, 0.005),
    "o3": Price(2.00, 8.00, 0.50),
    "o3-mini": Price(1.10, 4.40, 0.55),
    "o4-mini": Price(1.10, 4.40, 0.275),
    "gpt-3.5-turbo": Price(0.50, 1.50),
    # Anthropic's, as of ANTHROPIC_PRICES_AS_OF: input and output; cache writes 1.25x (5
    # minutes) and 2x (an hour) the input price, reads 0.1x; Message Batches half of all.
    "claude-opus-4-6": claude(5.00, 25.00),
    "claude-opus-4-5": claude(5.00, 25.00),
    "claude-opus-4-1": claude(15.00, 75.00),
    "claude-opus-4-0": claude(15.00, 75.00),
    "claude-sonnet-4-6": claude(3.00, 15.00),
    "claude-sonnet-4-5": claude(3.00, 15.00),
    "claude-sonnet-4-0": claude(3.00, 15.00),
    "claude-haiku-4-5": claude(1.00, 5.00),
    "claude-3-5-haiku": claude(0.80, 4.00),
}

# A dated snapshot: OpenAI's ``-2024-07-18``, Anthropic's ``-20250929``.
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")
LOCAL = Price(0.0, 0.0, 0.0, 1.0)


def model_family(model: str) -> str:
    """A dated snapshot's family (``gpt-4o-mini-2024-07-18`` -> ``gpt-4o-mini``,
    ``claude-sonnet-4-5-20250929`` -> ``claude-sonnet-4-5``)."""
    return _SNAPSHOT.sub("", model)


class PriceBook:
    """Prices by model name: the built-in table under the user's file."""

    __slots__ = ("_prices",)

    def __init__(self, overrides: Mapping[str, Price] | None = None) -> None:
        self._prices: dict[str, Price] = {**BUILTIN, **(overrides or {})}

    def price(self, model: str | None) -> Price | None:
        """The price of ``model`` (dated snapshots fall back to their family; a provider's
        model to its bare name), or None."""
        if model is None:
            return None
        parsed = ModelId.parse(model)
        if parsed.is_local:
            return LOCAL
        for name in dict.fromkeys((model, parsed.name)):
            found = self._prices.get(name) or self._prices.get(model_family(name))
            if found is not None:
                return found
        return None

    def known(self, model: str) -> bool:
        """Whether ``model`` has a price."""
        return self.price(model) is not None

    def step_cost(self, step: Step, default_model: str | None) -> float | None:
        """Dollars for one step, or None when its model has no price."""
        price = self.price(step.model or default_model)
        if price is None:
            return None
        return price.cost(step.usage, batch=at_batch_rate(step.batch_id, step.service_tier))

    def steps_cost(self, steps: Iterable[Step], model_for: Mapping[str, str]) -> float | None:
        """Dollars for several steps (``model_for`` by role, for steps that name none)."""
        total = 0.0
        for step in steps:
            cost = self.step_cost(step, model_for.get(step.role))
            if cost is None:
                return None
            total += cost
        return round(total, 8)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: expected a number of dollars per million tokens")
    if value < 0:
        raise ConfigError(f"{where}: must be >= 0")
    return float(value)


_OPTIONAL = ("cached_input", "cache_write", "cache_write_1h", "batch")


def _optional(entry: Mapping[str, Any], key: str, where: str) -> float | None:
    value = entry.get(key)
    return None if value is None else _number(value, f"{where}.{key}")


def load_prices(path: str | Path) -> dict[str, Price]:
    """Read a price file: JSON or TOML, ``model -> {input, output[, cached_input,
    cache_write, cache_write_1h, batch]}``."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"--prices {path}: cannot read: {err.strerror}") from err
    try:
        if path.suffix.lower() == ".toml":
            data: Any = tomllib.loads(raw.decode("utf-8"))
        else:
            data = orjson.loads(raw)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, orjson.JSONDecodeError) as err:
        raise ConfigError(f"--prices {path}: not valid JSON or TOML ({err})") from err
    if not isinstance(data, dict):
        raise ConfigError(f"--prices {path}: expected a table of model names")
    prices: dict[str, Price] = {}
    for model, entry in data.items():
        where = f"--prices {path}: {model}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected {{input, output[, {', '.join(_OPTIONAL)}]}}")
        unknown = set(entry) - {"input", "output", *_OPTIONAL}
        if unknown:
            raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        for key in ("input", "output"):
            if key not in entry:
                raise ConfigError(f"{where}: missing {key!r}")
        prices[model] = Price(
            _number(entry["input"], f"{where}.input"),
            _number(entry["output"], f"{where}.output"),
            cached_input=_optional(entry, "cached_input", where),
            batch=_number(entry.get("batch", BATCH_DISCOUNT), f"{where}.batch"),
            cache_write=_optional(entry, "cache_write", where),
            cache_write_1h=_optional(entry, "cache_write_1h", where),
        )
    return prices


def price_book(path: str | None, *, missing_ok: bool = False) -> PriceBook:
    """The built-in table under the price file at ``path`` (if any).

    ``missing_ok``: a file that is gone (a run's ``--prices`` read back later by status
    or report) leaves the built-in table, rather than an error.
    """
    if not path or (missing_ok and not Path(path).is_file()):
        return PriceBook()
    return PriceBook(load_prices(path))
