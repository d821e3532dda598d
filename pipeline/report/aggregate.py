"""The figures of a run's report, folded from its files in one streaming pass.

``outputs.jsonl`` and ``traces.jsonl`` are each read once, line by line, and folded
into running sums as they are read: memory grows with the number of iterations and
metric names, never with the number of records. The token and latency distributions
are kept as bounded reservoir samples (exact counts, means and maxima; percentiles
from the sample).

Quality by iteration is shown the two ways one can read the Self-Refine paper's
tables, for the critic's score and for every numeric or boolean metric of the job's
evaluator (booleans as the share of true), over the ``done`` records:

- **carried forward**: each record contributes its latest value at an iteration <= t,
  so a record that stopped early keeps its last answer. The population stays the same
  in every row, and the row-to-row change is what more refinement buys.
- **reached t**: only records that made at least t refinements. Records that stop early
  (often the easy ones) drop out, so later rows describe a different population.

Dollars come from each record's ``cost_usd`` (or its tokens at the model's price), and
per iteration from each traced call's price; a call whose model has no price is counted
as unknown, never as free.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from .distribution import Distribution, Reservoir
from .flips import FlipReport, open_flips
from .source import Key, Pricing, RunInfo, Scan, integer, number, read_run_info, record_values, scan

__all__ = [
    "SAMPLE_SIZE",
    "Cell",
    "Distribution",
    "Measure",
    "RunReport",
    "Spend",
    "Summary",
    "summarize",
]

SAMPLE_SIZE: Final = 10_000  # values kept per distribution (tokens, latency of each role)
ROLES: Final = ("generate", "feedback", "refine")


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cell:
    """A mean over ``n`` values (None when ``n`` is 0)."""

    mean: float | None
    n: int


@dataclass(frozen=True, slots=True)
class Measure:
    """One quality measure by iteration: the critic's score or one evaluator metric.

    ``reached[t]`` and ``carried[t]`` are the two readings of iteration ``t`` (see the
    module docstring). ``initial`` and ``chosen`` are means over the same records: those
    with a value both at iteration 0 and at their chosen iteration.
    """

    measured: Literal["score", "metric"]  # the critic's score, or an evaluator metric
    name: str
    rate: bool  # every value was a boolean: means are shares of true
    reached: tuple[Cell, ...]
    carried: tuple[Cell, ...]
    initial: Cell
    chosen: Cell

    @property
    def label(self) -> str:
        """How the measure is named in tables and plots."""
        if self.measured == "score":
            return "score (critic)"
        return f"{self.name} (rate)" if self.rate else self.name

    @property
    def gain(self) -> float | None:
        """Mean chosen value minus mean initial value, over the same records."""
        if self.initial.mean is None or self.chosen.mean is None:
            return None
        return self.chosen.mean - self.initial.mean


@dataclass(frozen=True, slots=True)
class Spend:
    """Dollars of a set of calls: the sum of those with a price, and how many had none."""

    calls: int
    dollars: float
    unknown: int  # calls whose model has no known price

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            self.calls + other.calls, self.dollars + other.dollars, self.unknown + other.unknown
        )

    @property
    def known(self) -> float | None:
        """The dollars, when every call had a price."""
        return self.dollars if self.unknown == 0 else None


NO_SPEND: Final = Spend(0, 0.0, 0)


@dataclass(frozen=True, slots=True)
class RunReport:
    """Everything the report shows, computed in one pass over the run directory."""

    run: RunInfo  # the run directory, job, models, state, input and expected records
    statuses: Mapping[str, int]  # finished records by status (done, failed)
    prompt_tokens: int
    completion_tokens: int
    calls: int
    cached_tokens: int  # of the prompt tokens, those served from the provider's cache
    cache_write_tokens: int  # of the prompt tokens, those written to its cache (Anthropic)
    tiers: Mapping[str, int]  # answered calls by the service tier that served them (if said)
    cost_usd: float | None  # dollars of the finished records whose cost is known
    cost_unknown: int  # finished records whose cost is unknown (no price for the model)
    rows: int  # iterations 0 .. rows-1 appear in the quality table
    reached_records: tuple[int, ...]  # done records that reached iteration t
    measures: tuple[Measure, ...]
    refined_chosen: int  # done records whose chosen answer is a refinement (iteration > 0)
    stop_reasons: Mapping[str, int]  # all finished records, most frequent first
    iterations: Mapping[int, int]  # done records by refinements made
    chosen_iterations: Mapping[int, int]  # done records by chosen iteration
    tokens: Distribution  # prompt + completion tokens per finished record
    latency: Mapping[str, Distribution]  # seconds per call, by role
    step_errors: Mapping[str, int]  # calls that recorded an error, by role
    retried: Mapping[str, int]  # calls that needed more than one attempt, by role
    call_kinds: Mapping[str, int]  # calls by call kind: the method's, repairs, each strategy's
    answer_spend: tuple[Spend, ...]  # traced generate/refine calls of iteration t
    feedback_spend: tuple[Spend, ...]  # traced feedback calls on the answer of iteration t
    skipped_lines: int  # unreadable lines (a line being written while we read)
    flips: FlipReport | None = None  # answers each round made better or worse, by metric
    hook_errors: Mapping[str, int] = field(default_factory=dict)  # answers each hook failed on

    @property
    def done(self) -> int:
        """Records finished as done."""
        return self.statuses.get("done", 0)

    @property
    def failed(self) -> int:
        """Records finished as failed."""
        return self.statuses.get("failed", 0)

    @property
    def pending(self) -> int | None:
        """Records not finished yet, when the input's size is known."""
        if self.run.records is None:
            return None
        return max(0, self.run.records - sum(self.statuses.values()))

    @property
    def priced(self) -> bool:
        """Whether any traced call has a price, so that cost by iteration means something."""
        return any(s.calls > s.unknown for s in (*self.answer_spend, *self.feedback_spend))

    def spend(self, t: int) -> Spend:
        """Calls of iteration ``t``: its answer (generate or refine) and the feedback on it."""
        return _at(self.answer_spend, t) + _at(self.feedback_spend, t)

    def step_spend(self, t: int) -> Spend:
        """What refinement ``t`` cost: the feedback on answer t-1 and the refine call itself."""
        return _at(self.feedback_spend, t - 1) + _at(self.answer_spend, t)

    def gain_per_dollar(self, m: Measure, t: int) -> float | None:
        """Carried-forward gain from t-1 to t, summed over records, per dollar refinement t cost.

        None at t = 0, without a value at t-1 or t, or when some call had no price.
        """
        if t < 1 or t >= len(m.carried):
            return None
        before, after = m.carried[t - 1], m.carried[t]
        dollars = self.step_spend(t).known
        if before.mean is None or after.mean is None or not dollars:
            return None
        return (after.mean - before.mean) * after.n / dollars


def _at(spends: Sequence[Spend], t: int) -> Spend:
    return spends[t] if 0 <= t < len(spends) else NO_SPEND


# -- streaming accumulators --------------------------------------------------------------------


class _Mean:
    """A running sum and count."""

    __slots__ = ("n", "total")

    def __init__(self) -> None:
        self.total = 0.0
        self.n = 0

    def add(self, value: float) -> None:
        self.total += value
        self.n += 1

    def cell(self, extra: _Mean | None = None) -> Cell:
        total = self.total + (extra.total if extra else 0.0)
        n = self.n + (extra.n if extra else 0)
        return Cell(total / n if n else None, n)


def _grow(means: list[_Mean], size: int) -> None:
    while len(means) < size:
        means.append(_Mean())


class _Series:
    """Per-iteration sums of one measure, fed one record's values at a time."""

    __slots__ = ("carried", "chosen", "initial", "nonbool", "reached", "tail")

    def __init__(self) -> None:
        self.reached: list[_Mean] = []
        self.carried: list[_Mean] = []
        # tail[k]: last values of records whose final iteration is k-1. Such a record
        # counts in every carried-forward row t >= k, and the last row is only known once
        # every record is read, so its value is added once here and spread in `build`.
        self.tail: list[_Mean] = []
        self.initial = _Mean()
        self.chosen = _Mean()
        self.nonbool = False

    def add(self, values: Sequence[float | None], chosen: int | None) -> None:
        _grow(self.reached, len(values))
        _grow(self.carried, len(values))
        _grow(self.tail, len(values) + 1)
        last: float | None = None
        for t, value in enumerate(values):
            if value is not None:
                self.reached[t].add(value)
                last = value
            if last is not None:
                self.carried[t].add(last)
        if last is not None:
            self.tail[len(values)].add(last)
        if chosen is not None and 0 <= chosen < len(values):
            first, best = values[0], values[chosen]
            if first is not None and best is not None:
                self.initial.add(first)
                self.chosen.add(best)

    def build(self, measured: Literal["score", "metric"], name: str, rows: int) -> Measure:
        reached: list[Cell] = []
        carried: list[Cell] = []
        stopped = _Mean()  # records that stopped before t, at their last value
        for t in range(rows):
            if t < len(self.tail):
                stopped.total += self.tail[t].total
                stopped.n += self.tail[t].n
            here = self.reached[t] if t < len(self.reached) else _Mean()
            reached.append(here.cell())
            carried.append((self.carried[t] if t < len(self.carried) else _Mean()).cell(stopped))
        return Measure(
            measured=measured,
            name=name,
            rate=measured == "metric" and not self.nonbool,
            reached=tuple(reached),
            carried=tuple(carried),
            initial=self.initial.cell(),
            chosen=self.chosen.cell(),
        )


class _Quality:
    """Per-iteration sums of the score and of every evaluator metric, over done records."""

    __slots__ = ("chosen", "iterations", "reached", "refined_chosen", "series")

    def __init__(self) -> None:
        self.series: dict[Key, _Series] = {}  # metrics in first-seen order
        self.reached: list[int] = []
        self.iterations: Counter[int] = Counter()
        self.chosen: Counter[int] = Counter()
        self.refined_chosen = 0

    def add(self, line: Mapping[str, Any]) -> None:
        values = record_values(line)
        while len(self.reached) < values.size:
            self.reached.append(0)
        for t in range(values.size):
            self.reached[t] += 1
        self.iterations[values.made] += 1
        if values.chosen is not None:
            self.chosen[values.chosen] += 1
            if values.chosen > 0:
                self.refined_chosen += 1
        for key, series in values.series.items():
            acc = self.series.setdefault(key, _Series())
            acc.nonbool = acc.nonbool or values.numeric[key]
            acc.add(series, values.chosen)

    def measures(self) -> tuple[Measure, ...]:
        rows = len(self.reached)
        out = []
        for (measured, name), series in self.series.items():
            if any(m.n for m in series.reached):  # a measure no record ever had is no column
                out.append(series.build(measured, name, rows))
        out.sort(key=lambda m: m.measured != "score")  # stable: metrics keep first-seen order
        return tuple(out)


class _Spends:
    """Dollars of calls by iteration."""

    __slots__ = ("calls", "dollars", "unknown")

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.dollars: list[float] = []
        self.unknown: list[int] = []

    def add(self, t: int, dollars: float | None) -> None:
        while len(self.calls) <= t:
            self.calls.append(0)
            self.dollars.append(0.0)
            self.unknown.append(0)
        self.calls[t] += 1
        if dollars is None:
            self.unknown[t] += 1
        else:
            self.dollars[t] += dollars

    def freeze(self) -> tuple[Spend, ...]:
        return tuple(map(Spend, self.calls, self.dollars, self.unknown))


# -- the reader --------------------------------------------------------------------------------


class Summary:
    """A run reader that folds every line into the report's figures."""

    def __init__(self, pricing: Pricing, sample_size: int = SAMPLE_SIZE) -> None:
        self.pricing = pricing
        self.sample_size = sample_size
        self.statuses: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.usage = dict.fromkeys(
            ("prompt_tokens", "cached_tokens", "cache_write_tokens", "completion_tokens", "calls"),
            0,
        )
        self.dollars = 0.0
        self.priced = 0
        self.unpriced = 0
        self.tokens = Reservoir(sample_size)
        self.quality = _Quality()
        self.latency: dict[str, Reservoir] = {}
        self.errors: Counter[str] = Counter()
        self.retried: Counter[str] = Counter()
        self.call_kinds: Counter[str] = Counter()
        self.tiers: Counter[str] = Counter()
        self.answers = _Spends()
        self.feedback = _Spends()
        self.hooks: Counter[str] = Counter()

    def output(self, line: Mapping[str, Any]) -> None:
        """Count one outputs.jsonl line."""
        # outputs.jsonl holds one line per id (the writer checks its keys), so lines are not
        # de-duplicated here: that would need a set of every id.
        status = str(line.get("status"))
        self.statuses[status] += 1
        self.reasons[str(line.get("stop_reason"))] += 1
        used = line.get("usage")
        used = used if isinstance(used, dict) else {}
        for k in self.usage:
            self.usage[k] += integer(used.get(k))
        self.tokens.add(integer(used.get("prompt_tokens")) + integer(used.get("completion_tokens")))
        dollars = self.pricing.record(line)
        if dollars is None:
            self.unpriced += 1
        else:
            self.priced += 1
            self.dollars += dollars
        hooks = line.get("hook_errors")
        if isinstance(hooks, dict):
            self.hooks.update({str(k): integer(v) for k, v in hooks.items()})
        if status == "done":
            self.quality.add(line)

    def trace(self, line: Mapping[str, Any]) -> None:
        """Count the calls of one traces.jsonl line."""
        steps = line.get("steps")
        for step in steps if isinstance(steps, list) else []:
            if not isinstance(step, dict):
                continue
            role = str(step.get("role"))
            if step.get("response") is not None:  # a call made (not one that failed for good)
                self.call_kinds[
                    str(step.get("kind") or ("feedback" if role == "feedback" else "answer"))
                ] += 1
                if step.get("service_tier"):
                    self.tiers[str(step["service_tier"])] += 1
            seconds = number(step.get("latency_s"))
            if seconds is not None:
                if role not in self.latency:
                    self.latency[role] = Reservoir(self.sample_size)
                self.latency[role].add(seconds[0])
            if step.get("error"):
                self.errors[role] += 1
            if integer(step.get("attempts"), 1) > 1:
                self.retried[role] += 1
            t = integer(step.get("iteration"), -1)
            if t >= 0:
                spends = self.feedback if role == "feedback" else self.answers
                spends.add(t, self.pricing.step(step))

    def report(self, found: Scan) -> RunReport:
        """The figures, once every line has been read."""
        info: RunInfo = found.info
        order = sorted(
            self.latency, key=lambda r: (ROLES.index(r) if r in ROLES else len(ROLES), r)
        )
        dollars: float | None = self.dollars
        if not self.priced:
            # Nothing was priced: unknown, except that an empty run of a priced model cost 0.
            free = self.pricing.book.price(self.pricing.model_for.get("generate")) is not None
            dollars = 0.0 if free and not self.unpriced else None
        return RunReport(
            run=info,
            statuses=dict(self.statuses),
            prompt_tokens=self.usage["prompt_tokens"],
            completion_tokens=self.usage["completion_tokens"],
            calls=self.usage["calls"],
            cached_tokens=self.usage["cached_tokens"],
            cache_write_tokens=self.usage["cache_write_tokens"],
            tiers=dict(self.tiers.most_common()),
            cost_usd=dollars,
            cost_unknown=self.unpriced,
            rows=len(self.quality.reached),
            reached_records=tuple(self.quality.reached),
            measures=self.quality.measures(),
            refined_chosen=self.quality.refined_chosen,
            stop_reasons=dict(self.reasons.most_common()),
            iterations=dict(sorted(self.quality.iterations.items())),
            chosen_iterations=dict(sorted(self.quality.chosen.items())),
            tokens=self.tokens.freeze(),
            latency={role: self.latency[role].freeze() for role in order},
            step_errors=dict(self.errors),
            retried=dict(self.retried),
            call_kinds=dict(self.call_kinds.most_common()),
            answer_spend=self.answers.freeze(),
            feedback_spend=self.feedback.freeze(),
            skipped_lines=found.skipped_lines,
            hook_errors=dict(sorted(self.hooks.items())),
        )


def summarize(run_dir: Path, *, sample_size: int = SAMPLE_SIZE) -> RunReport:
    """Read a run directory once and compute every figure of its report."""
    info = read_run_info(run_dir)
    summary = Summary(info.pricing, sample_size)
    flips = open_flips(info)
    found = scan(info, [summary, flips])
    return replace(summary.report(found), flips=flips.report())
