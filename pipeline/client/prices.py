"""Prices: dollars per million tokens by model, and the cost of the calls a run made.

The built-in table holds OpenAI's published list prices for common models. Providers
change prices: ``--prices FILE`` (JSON or TOML, model name -> ``{input, output}`` and
optionally ``cached_input`` and ``batch``) overrides and extends it. Models served by
the embedded local model (``local:NAME``) cost nothing. A model with no price has an
unknown cost, shown as such, never guessed.

Prompt tokens the provider served from its prefix cache (``cached_tokens``) cost the
cached rate. Calls made through the Batch API, and those the flex tier served, cost the
model's ``batch`` factor of the real-time price (OpenAI bills flex at Batch API rates).
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
    "BATCH_DISCOUNT",
    "BUILTIN",
    "PRICES_AS_OF",
    "Price",
    "PriceBook",
    "at_batch_rate",
    "load_prices",
    "model_family",
    "price_book",
]

# The Batch API bills half the real-time price for every model it serves (and so does the
# flex tier, for the models it serves).
BATCH_DISCOUNT = 0.5
PRICES_AS_OF = "2025-08-15"  # when the table below was checked against openai.com/api/pricing


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
    batch: float = BATCH_DISCOUNT  # factor for calls through the Batch API or on the flex tier

    def cost(self, usage: Mapping[str, int], *, batch: bool = False) -> float:
        """Dollars for one call's usage."""
        prompt = int(usage.get("prompt_tokens", 0))
        cached = min(int(usage.get("cached_tokens", 0)), prompt)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        dollars = (
            (prompt - cached) * self.input
            + cached * cached_rate
            + int(usage.get("completion_tokens", 0)) * self.output
        ) / 1e6
        return dollars * (self.batch if batch else 1.0)


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
}

_SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}$")
LOCAL = Price(0.0, 0.0, 0.0, 1.0)


def model_family(model: str) -> str:
    """A dated snapshot's family (``gpt-4o-mini-2024-07-18`` -> ``gpt-4o-mini``)."""
    return _SNAPSHOT.sub("", model)


class PriceBook:
    """Prices by model name: the built-in table under the user's file."""

    __slots__ = ("_prices",)

    def __init__(self, overrides: Mapping[str, Price] | None = None) -> None:
        self._prices: dict[str, Price] = {**BUILTIN, **(overrides or {})}

    def price(self, model: str | None) -> Price | None:
        """The price of ``model`` (dated snapshots fall back to their family), or None."""
        if model is None:
            return None
        if ModelId.parse(model).is_local:
            return LOCAL
        found = self._prices.get(model)
        if found is None:
            found = self._prices.get(model_family(model))
        return found

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


def load_prices(path: str | Path) -> dict[str, Price]:
    """Read a price file: JSON or TOML, ``model -> {input, output[, cached_input, batch]}``."""
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
            raise ConfigError(f"{where}: expected {{input, output[, cached_input, batch]}}")
        unknown = set(entry) - {"input", "output", "cached_input", "batch"}
        if unknown:
            raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        for key in ("input", "output"):
            if key not in entry:
                raise ConfigError(f"{where}: missing {key!r}")
        cached = entry.get("cached_input")
        prices[model] = Price(
            _number(entry["input"], f"{where}.input"),
            _number(entry["output"], f"{where}.output"),
            None if cached is None else _number(cached, f"{where}.cached_input"),
            _number(entry.get("batch", BATCH_DISCOUNT), f"{where}.batch"),
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
