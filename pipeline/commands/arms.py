"""The arms ``refine calibrate`` compares at equal budget, and what their run directories hold.

::

    refine      Self-Refine with the options given               DIR/refine
    best-of-n   --max-iters 0 --strategy samples=N, N sized      DIR/best-of-n/samples-N
                after refine ran, so its calls per record
                match refine's
    first       the first answer: refine's iteration 0 (no call  (DIR/refine; DIR/first,
                of its own)                                        --max-iters 0, without refine)

**Calls** are every call a record made that the provider answered: the method's own
(generate, feedback, refine), the repairs of answers cut off at max_tokens, and every draft
a strategy added; a call that failed for good is not one (as in ``usage.calls``). A
best-of-n record makes N drafts and their repairs, so with ``d`` calls per draft (1 plus
the share of first drafts refine's run had to repair) it makes about ``N * d`` calls. N is
a whole number: where refine's calls per record ``c`` fall between ``N * d`` and
``(N + 1) * d``, the records are split, every record at an even position (the same rule as
the sample's) drafted N + 1 times and the rest N, in the shares that make the mean ``c``.
Each part is a run directory of its own, ``samples-N``. The output of each record is
chosen by the job's own rule, from what the checks say: never by a label.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.steps import Superseded
from ..core.strategies import MAX_SAMPLES
from ..errors import ConfigError
from ..report.comparison import ArmFigures
from ..report.source import Skipped, objects, read_run_info

__all__ = [
    "Arm",
    "Part",
    "Spent",
    "even_positions",
    "figures",
    "parse_arms",
    "read_first_answers",
    "read_outputs",
    "size_best_of_n",
]


class Arm(enum.StrEnum):
    """A way to spend on each record, as ``--arms`` names it."""

    REFINE = "refine"
    BEST_OF_N = "best-of-n"
    FIRST = "first"


def parse_arms(text: str) -> tuple[Arm, ...]:
    """``--arms refine,best-of-n,first`` (any order, any subset) as arms in the table's order."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    known = {str(a) for a in Arm}
    unknown = sorted(names - known)
    if unknown or not names:
        raise ConfigError(
            f"--arms {text!r}: {'unknown arm ' + ', '.join(unknown) if unknown else 'no arm'} "
            f"(known: {', '.join(known)})"
        )
    arms = tuple(a for a in Arm if a in names)
    if Arm.BEST_OF_N in arms and Arm.REFINE not in arms:
        raise ConfigError(
            "--arms: best-of-n is sized by the calls the refine arm makes: add refine"
        )
    return arms


def even_positions(total: int, size: int) -> list[int]:
    """``size`` positions spread evenly over ``total`` (all of them when there are fewer)."""
    if total <= size:
        return list(range(total))
    return [i * total // size for i in range(size)]


@dataclass(frozen=True, slots=True)
class Part:
    """Records (positions in the sample) drafted ``samples`` times."""

    samples: int
    positions: tuple[int, ...]


def size_best_of_n(calls: float, per_draft: float, records: int) -> tuple[Part, ...]:
    """Best-of-N parts whose calls per record average ``calls`` (see the module).

    ``per_draft``: calls a draft takes with its repairs (at least 1). N stays within 1 and
    the strategy's most, ``MAX_SAMPLES``.
    """
    if records < 1:
        return ()
    target = min(max(calls / max(per_draft, 1.0), 1.0), float(MAX_SAMPLES))
    low = math.floor(target)
    more = round((target - low) * records) if low < MAX_SAMPLES else 0
    everything = tuple(range(records))
    if more == 0:
        return (Part(low, everything),)
    if more == records:
        return (Part(low + 1, everything),)
    upper = set(even_positions(records, more))
    return (
        Part(low, tuple(p for p in everything if p not in upper)),
        Part(low + 1, tuple(sorted(upper))),
    )


@dataclass(frozen=True, slots=True)
class Spent:
    """An arm's records: the metric's value for each, and the calls, tokens and dollars."""

    values: Mapping[str, bool | None]  # record id -> right or wrong (None: not measured)
    records: int
    calls: int
    drafts: int  # answers that stand among the calls (iteration 0 only, for the first answer)
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    dollars: float | None  # None: some call had no price

    def per_record(self, total: float | None) -> float | None:
        """``total`` over the arm's records."""
        return None if total is None or not self.records else total / self.records


def _value(where: Path, rid: str, metrics: Any, metric: str) -> bool | None:
    value = metrics.get(metric) if isinstance(metrics, dict) else None
    if value is not None and not isinstance(value, bool):
        raise ConfigError(
            f"--metric {metric}: {where} gives record {rid} the value {value!r}, not true "
            "or false: calibrate by a right-or-wrong metric"
        )
    return value


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def read_outputs(run_dirs: Iterable[Path], metric: str) -> Spent:
    """An arm from the output lines of its run directories: each record's chosen output."""
    values: dict[str, bool | None] = {}
    calls = prompt = cached = completion = 0
    dollars: float | None = 0.0
    for run_dir in run_dirs:
        for line in objects(run_dir / "outputs.jsonl", Skipped()):
            rid = str(line.get("id"))
            values[rid] = _value(run_dir, rid, line.get("metrics"), metric)
            usage = line.get("usage") or {}
            calls += int(usage.get("calls", 0))
            prompt += int(usage.get("prompt_tokens", 0))
            cached += int(usage.get("cached_tokens", 0))
            completion += int(usage.get("completion_tokens", 0))
            cost = line.get("cost_usd")
            dollars = _add(dollars, float(cost) if isinstance(cost, int | float) else None)
    return Spent(values, len(values), calls, calls, prompt, cached, completion, dollars)


def read_first_answers(run_dir: Path, metric: str) -> Spent:
    """The first-answer arm from a run: iteration 0's answer and the calls that made it."""
    pricing = read_run_info(run_dir).pricing
    values: dict[str, bool | None] = {}
    for line in objects(run_dir / "outputs.jsonl", Skipped()):
        rid = str(line.get("id"))
        by_iteration = line.get("metrics_by_iteration") or [None]
        values[rid] = _value(run_dir, rid, by_iteration[0], metric)
    calls = drafts = prompt = cached = completion = 0
    dollars: float | None = 0.0
    for trace in objects(run_dir / "traces.jsonl", Skipped()):
        if str(trace.get("id")) not in values:
            continue
        for step in _first_answer_calls(trace.get("steps")):
            usage = step.get("usage") or {}
            calls += 1
            drafts += (step.get("error") or {}).get("type") not in tuple(Superseded)
            prompt += int(usage.get("prompt_tokens", 0))
            cached += int(usage.get("cached_tokens", 0))
            completion += int(usage.get("completion_tokens", 0))
            dollars = _add(dollars, pricing.step(step))
    return Spent(values, len(values), calls, drafts, prompt, cached, completion, dollars)


def _first_answer_calls(steps: Any) -> list[dict[str, Any]]:
    """The calls of iteration 0's answers that were answered (drafts, samples, repairs)."""
    return [
        s
        for s in (steps if isinstance(steps, list) else [])
        if isinstance(s, dict)
        and s.get("role") != "feedback"
        and s.get("iteration") == 0
        and s.get("response") is not None
    ]


def figures(name: str, spent: Spent, ids: Sequence[str]) -> ArmFigures:
    """The arm as compared: right or wrong on each of ``ids``, and its spend per record.

    A record the arm has no value for (no answer stands, or it failed before one) is wrong.
    """
    return ArmFigures(
        name=name,
        right=tuple(spent.values.get(rid) is True for rid in ids),
        calls=spent.per_record(spent.calls) or 0.0,
        tokens=spent.per_record(spent.prompt_tokens + spent.completion_tokens) or 0.0,
        dollars=spent.per_record(spent.dollars),
    )
