"""Flips: per refinement round, how many answers each metric says got better, worse or stayed.

Over the ``done`` records, for every evaluator metric with a better direction (booleans
are higher-is-better unless the job declares otherwise; a number needs the job's
declaration, ``METRICS`` in its hooks): a record's value at iteration t is that of its
answer at t, or, once its loop has stopped, of its last answer (carried forward, as the
report's means are). Round t (t >= 1) compares each record's value at t

- with its value at t-1 (**vs previous**: what the round itself did), and
- with its value at 0 (**vs first**: where the record stands after t rounds),

over the records with the metric at both, as better, worse or the same. The **chosen**
output (the answer the record ended with) is compared with the first the same way. For
a right-or-wrong metric each comparison also gives the correction and introduction rates
of :mod:`.payoff`, and the rule over them.

The job's checks read no label; the chosen output should never be an answer they rank
below the first (``AnswerKind.rank``). :class:`Flips` counts the records where it is,
from each trace's ``iteration_answer`` and ``chosen`` marks.

One streaming pass, like the rest of the report: memory grows with the number of rounds
and metrics, never with the number of records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.jobs import Job
from ..core.loader import load_job
from ..core.metrics import Better, MetricSpec, Source, compare
from ..core.trace import steps_of
from ..errors import RefineError
from .payoff import Rates
from .source import RunInfo, number

__all__ = [
    "Change",
    "FlipReport",
    "Flips",
    "MetricFlips",
    "RankCheck",
    "Round",
    "open_flips",
    "values_at",
]


@dataclass(frozen=True, slots=True)
class Change:
    """How many records a comparison found better, worse, or the same."""

    better: int
    worse: int
    same: int

    @property
    def n(self) -> int:
        """Records compared."""
        return self.better + self.worse + self.same


@dataclass(frozen=True, slots=True)
class Round:
    """Round t of one metric (t = None: the chosen output against the first answer)."""

    t: int | None
    vs_previous: Change  # for the chosen output: against the first answer
    vs_first: Change
    rates: Rates | None  # right-or-wrong metrics only: of the ``vs_previous`` comparison


@dataclass(frozen=True, slots=True)
class MetricFlips:
    """One metric's flips by round, and of the chosen output."""

    name: str
    source: Source | None  # None: the job does not declare the metric
    better: Better
    boolean: bool
    right: tuple[tuple[int, int], ...]  # booleans: (right, records) at each t = 0..
    rounds: tuple[Round, ...]  # t = 1..
    chosen: Round

    @property
    def label(self) -> str:
        """The metric's name, and where its values come from."""
        where = {"label": "from a label", "check": "from checks", None: "undeclared"}
        return f"{self.name} ({where[self.source]})"

    def accuracy(self, t: int) -> float | None:
        """Share right at t (booleans), over the records with the metric at t."""
        right, n = self.right[t] if t < len(self.right) else (0, 0)
        return right / n if n else None


@dataclass(frozen=True, slots=True)
class RankCheck:
    """Records whose chosen output the job's checks rank below their first answer."""

    compared: int  # traces marking both the first and the chosen answer
    below: int
    unmarked: int  # traces without those marks (written before traces had them)


@dataclass(frozen=True, slots=True)
class FlipReport:
    """Every metric's flips, the metrics without a direction, and the rank check."""

    metrics: tuple[MetricFlips, ...]
    undirected: tuple[str, ...]  # numeric metrics the job gives no better direction
    ranks: RankCheck | None  # None: the job could not be loaded
    job_problem: str | None = None  # why the job could not be loaded


# -- per-record values -------------------------------------------------------------------------


def values_at(line: Mapping[str, Any]) -> dict[str, list[tuple[float, bool] | None]]:
    """Each metric's value (number, was-boolean) of each iteration's answer, by name."""
    by_iteration = line.get("metrics_by_iteration")
    out: dict[str, list[tuple[float, bool] | None]] = {}
    if not isinstance(by_iteration, list):
        return out
    for t, metrics in enumerate(by_iteration):
        if not isinstance(metrics, dict):
            continue
        for name, raw in metrics.items():
            value = number(raw)
            if value is not None:
                out.setdefault(str(name), [None] * len(by_iteration))[t] = value
    return out


class _Count:
    """Comparisons of one measure: better, worse, same, and the values before that were 1 or 0."""

    __slots__ = ("better", "ones", "same", "worse", "zeros")

    def __init__(self) -> None:
        self.better = self.worse = self.same = self.ones = self.zeros = 0

    def add(self, before: float, after: float, better: Better) -> None:
        step = compare(before, after, better)
        self.better += step > 0
        self.worse += step < 0
        self.same += step == 0
        self.ones += before == 1.0
        self.zeros += before == 0.0

    def merged(self, others: Sequence[_Count]) -> _Count:
        total = _Count()
        for c in (self, *others):
            total.better += c.better
            total.worse += c.worse
            total.same += c.same
            total.ones += c.ones
            total.zeros += c.zeros
        return total

    def change(self) -> Change:
        return Change(self.better, self.worse, self.same)

    def rates(self, better: Better) -> Rates:
        right = self.ones if better == "higher" else self.zeros
        return Rates(self.better + self.worse + self.same, right, self.better, self.worse)


def _at(counts: list[_Count], i: int) -> _Count:
    while len(counts) <= i:
        counts.append(_Count())
    return counts[i]


class _Metric:
    """One metric's counts. A record whose loop stopped at L counts in rounds t > L with its
    last value; those rounds are known only at the end, so it is added once to ``tail_*[L]``
    and spread over them by ``build``."""

    __slots__ = (
        "better",
        "boolean",
        "chosen",
        "first",
        "level",
        "prev",
        "tail_first",
        "tail_level",
    )

    def __init__(self, better: Better) -> None:
        self.better = better
        self.boolean = True
        self.prev: list[_Count] = []  # [t]: t-1 -> t
        self.first: list[_Count] = []  # [t]: 0 -> t
        self.level: list[_Count] = []  # [t]: the value at t (as "before" of a same comparison)
        self.tail_first: list[_Count] = []  # [L]: 0 -> L, for every t > L
        self.tail_level: list[_Count] = []  # [L]: the value at L, for every t > L
        self.chosen = _Count()

    def add(self, values: Sequence[tuple[float, bool] | None], chosen: float | None) -> None:
        self.boolean = self.boolean and all(v is None or v[1] for v in values)
        last = len(values) - 1
        first = values[0]
        for t, value in enumerate(values):
            if value is None:
                continue
            _at(self.level, t).add(value[0], value[0], self.better)
            before = values[t - 1] if t else None
            if before is not None:
                _at(self.prev, t).add(before[0], value[0], self.better)
            if t and first is not None:
                _at(self.first, t).add(first[0], value[0], self.better)
        end = values[last]
        if end is not None:
            _at(self.tail_level, last).add(end[0], end[0], self.better)
            if first is not None:
                _at(self.tail_first, last).add(first[0], end[0], self.better)
        if first is not None and chosen is not None:
            self.chosen.add(first[0], chosen, self.better)

    def build(self, name: str, spec: MetricSpec | None, rows: int) -> MetricFlips:
        boolean = self.boolean
        rounds: list[Round] = []
        right: list[tuple[int, int]] = []
        for t in range(rows):
            stopped = self.tail_level[:t]  # records whose last answer came before t
            level = _at(self.level, t).merged(stopped)
            r = level.rates(self.better)
            right.append((r.right_before, r.n))
            if t == 0:
                continue
            # Carried forward, a stopped record's round t changes nothing (same as t-1).
            prev = _at(self.prev, t).merged(stopped)
            first = _at(self.first, t).merged(self.tail_first[:t])
            rates = prev.rates(self.better) if boolean else None
            rounds.append(Round(t, prev.change(), first.change(), rates))
        chosen = self.chosen.change()
        rates = self.chosen.rates(self.better) if boolean else None
        return MetricFlips(
            name=name,
            source=None if spec is None else spec.source,
            better=self.better,
            boolean=boolean,
            right=tuple(right) if boolean else (),
            rounds=tuple(rounds),
            chosen=Round(None, chosen, chosen, rates),
        )


# -- the reader --------------------------------------------------------------------------------


class Flips:
    """A run reader that counts flips from outputs.jsonl and checks ranks in traces.jsonl."""

    def __init__(self, job: Job | None, job_problem: str | None = None) -> None:
        self.job = job
        self.job_problem = job_problem
        self.specs: Mapping[str, MetricSpec] = {} if job is None else job.metrics
        self.metrics: dict[str, _Metric] = {}  # in first-seen order
        self.rows = 0
        self.compared = self.below = self.unmarked = 0

    def output(self, line: Mapping[str, Any]) -> None:
        """Count one outputs.jsonl line (done records only)."""
        if line.get("status") != "done":
            return
        chosen = line.get("metrics")
        chosen = chosen if isinstance(chosen, dict) else {}
        for name, values in values_at(line).items():
            spec = self.specs.get(name)
            better: Better | None = "higher" if spec is None else spec.better
            if better is None:
                continue
            acc = self.metrics.get(name)
            if acc is None:
                # Undeclared: higher is better for a boolean; a number is dropped in `report`.
                acc = self.metrics[name] = _Metric(better)
            self.rows = max(self.rows, len(values))
            value = number(chosen.get(name))
            acc.add(values, None if value is None else value[0])

    def trace(self, line: Mapping[str, Any]) -> None:
        """Compare, by the job's checks, a record's chosen answer with its first."""
        if self.job is None:
            return
        steps = line.get("steps")
        steps = [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []
        first = next(
            (
                i
                for i, s in enumerate(steps)
                if s.get("iteration_answer") and s.get("iteration") == 0
            ),
            None,
        )
        chosen = next((i for i, s in enumerate(steps) if s.get("chosen")), None)
        if first is None or chosen is None:
            self.unmarked += 1
            return
        try:
            built = steps_of(steps)
        except ValueError:
            self.unmarked += 1
            return
        a, b = built[first], built[chosen]
        self.compared += 1
        self.below += self.job.answer_kind.rank(b) < self.job.answer_kind.rank(a)

    def report(self) -> FlipReport:
        """The counts, once every line has been read."""
        built: list[MetricFlips] = []
        undirected = [n for n, s in self.specs.items() if s.better is None]
        for name, acc in self.metrics.items():
            spec = self.specs.get(name)
            if spec is None and not acc.boolean:
                undirected.append(name)
                continue
            built.append(acc.build(name, spec, self.rows))
        ranks = None
        if self.job is not None:
            ranks = RankCheck(self.compared, self.below, self.unmarked)
        return FlipReport(tuple(built), tuple(undirected), ranks, self.job_problem)


def open_flips(info: RunInfo) -> Flips:
    """A flips reader for the run, with its job loaded for the metrics' declarations and
    the ranks (without them, when the job cannot be loaded now)."""
    try:
        job = load_job(info.job_source or info.job)
    except RefineError as err:
        return Flips(None, f"the job could not be loaded ({err})")
    if info.job_hash and job.content_hash != info.job_hash:
        return Flips(job, "the job's files changed since the run: declarations of the current ones")
    return Flips(job)
