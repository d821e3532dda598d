"""What a run has used so far: records by status, calls, tokens and dollars.

Finished records count from their output lines; records still in flight or interrupted
count from the checkpoint journal, so a status taken mid-run (or after a kill) includes
every completed call. The runner uses the same tally to start ``--budget`` from what
earlier invocations spent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..client.prices import PriceBook
from ..core.steps import Step, hook_errors_of, usage_of

__all__ = ["Tally", "tally", "tally_outputs"]


@dataclass(slots=True)
class Tally:
    """Counts of a run directory's records and of the calls they made."""

    done: int = 0
    failed: int = 0
    in_progress: int = 0  # records with completed calls but no output line yet
    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, those the provider served from its cache
    cache_write_tokens: int = 0  # of the prompt tokens, those written to its cache (Anthropic)
    completion_tokens: int = 0
    cost_usd: float | None = 0.0  # None: some call was to a model with no price
    hook_errors: Counter[str] = field(default_factory=Counter)  # answers each hook failed on
    finished_ids: set[str] = field(default_factory=set)

    def add_cost(self, cost: float | None) -> None:
        """Add one record's dollars (None makes the total unknown)."""
        if cost is None or self.cost_usd is None:
            self.cost_usd = None
        else:
            self.cost_usd += cost

    def add_unfinished(
        self,
        unfinished: Mapping[str, Sequence[Step]],
        prices: PriceBook,
        model_for: Mapping[str, str],
    ) -> None:
        """Count the journaled calls of records that have no output line."""
        for rid, steps in unfinished.items():
            if rid in self.finished_ids or not steps:
                continue
            self.in_progress += 1
            used = usage_of(steps)
            self.calls += used["calls"]
            self.prompt_tokens += used["prompt_tokens"]
            self.cached_tokens += used["cached_tokens"]
            self.cache_write_tokens += used.get("cache_write_tokens", 0)
            self.completion_tokens += used["completion_tokens"]
            self.hook_errors.update(hook_errors_of(steps))
            self.add_cost(prices.steps_cost(steps, model_for))


def tally(
    outputs: Path,
    unfinished: Mapping[str, Sequence[Step]],
    prices: PriceBook,
    model_for: Mapping[str, str],
) -> Tally:
    """Count finished records from ``outputs`` and the rest from their journaled steps.

    ``unfinished`` is the journal's steps of records not ``done`` (failed ones too: their
    output line counts, not their steps). ``model_for`` names the model by role for steps
    journaled before steps named their model, and prices output lines written before
    they carried ``cost_usd``.
    """
    t = tally_outputs(outputs, prices, model_for)
    t.add_unfinished(unfinished, prices, model_for)
    return t


def tally_outputs(outputs: Path, prices: PriceBook, model_for: Mapping[str, str]) -> Tally:
    """Count the finished records of an outputs.jsonl."""
    t = Tally()
    if outputs.exists():
        with outputs.open("rb") as fh:
            for raw in fh:
                try:
                    line = orjson.loads(raw)
                    rid = str(line["id"])
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    continue  # a line being written right now
                if rid in t.finished_ids:
                    continue
                t.finished_ids.add(rid)
                if line.get("status") == "failed":
                    t.failed += 1
                else:
                    t.done += 1
                usage = line.get("usage") or {}
                t.calls += int(usage.get("calls", 0))
                t.prompt_tokens += int(usage.get("prompt_tokens", 0))
                t.cached_tokens += int(usage.get("cached_tokens", 0))
                t.cache_write_tokens += int(usage.get("cache_write_tokens", 0))
                t.completion_tokens += int(usage.get("completion_tokens", 0))
                hooks = line.get("hook_errors")
                if isinstance(hooks, dict):
                    t.hook_errors.update({str(k): int(v) for k, v in hooks.items()})
                if "cost_usd" in line:
                    t.add_cost(line["cost_usd"])
                else:
                    price = prices.price(model_for.get("generate"))
                    t.add_cost(None if price is None else price.cost(usage))
    return t
