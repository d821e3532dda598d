"""``refine report``: a Markdown summary of a run directory, with PNG plots.

``outputs.jsonl`` and ``traces.jsonl`` are each read once, line by line, and folded
into running sums as they are read: memory grows with the number of iterations and
metric names, never with the number of records. The token and latency distributions
are kept as bounded reservoir samples (exact counts, means and maxima; percentiles
from the sample).

Quality by iteration is shown the two ways one can read the Self-Refine paper's
tables, for the critic's score and for every numeric or boolean metric of the job's
evaluator (booleans as the share of true), over the ``done`` records:

- **carried forward**: each record contributes its latest value at an iteration ≤ t,
  so a record that stopped early keeps its last answer. The population stays the same
  in every row, and the row-to-row change is what more refinement buys.
- **reached t**: only records that made at least t refinements. Records that stop early
  (often the easy ones) drop out, so later rows describe a different population.

Only the data part (:func:`summarize`, :func:`render_markdown`) runs without
matplotlib; :func:`write_report` imports it when called, so ``import pipeline`` never
needs it.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import orjson

from .errors import ConfigError, StoreError
from .manifest import now_iso
from .prices import PriceBook
from .rundir import RunDir
from .tally import tally_outputs

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

__all__ = [
    "SAMPLE_SIZE",
    "Cell",
    "Distribution",
    "Measure",
    "RunReport",
    "render_markdown",
    "summarize",
    "write_report",
]

SAMPLE_SIZE: Final = 10_000  # values kept per distribution (tokens, latency of each role)
INSTALL_HINT: Final = "pip install 'refine[report]'"
DPI: Final = 100
FIGSIZE: Final = (6.4, 3.6)
ROLES: Final = ("generate", "feedback", "refine")

Key = tuple[Literal["score", "metric"], str]
SCORE: Final[Key] = ("score", "score")


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

    kind: Literal["score", "metric"]
    name: str
    rate: bool  # every value was a boolean: means are shares of true
    reached: tuple[Cell, ...]
    carried: tuple[Cell, ...]
    initial: Cell
    chosen: Cell

    @property
    def label(self) -> str:
        """How the measure is named in tables and plots."""
        if self.kind == "score":
            return "score (critic)"
        return f"{self.name} (rate)" if self.rate else self.name

    @property
    def gain(self) -> float | None:
        """Mean chosen value minus mean initial value, over the same records."""
        if self.initial.mean is None or self.chosen.mean is None:
            return None
        return self.chosen.mean - self.initial.mean


@dataclass(frozen=True, slots=True)
class Distribution:
    """Exact count, mean and extremes of a stream of values, plus a bounded sample of it."""

    count: int
    mean: float | None
    min: float | None
    max: float | None
    sample: tuple[float, ...]

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile of the sample (exact while the stream fit in the sample)."""
        if not self.sample:
            return None
        ordered = sorted(self.sample)
        pos = (len(ordered) - 1) * q
        lo = math.floor(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class RunReport:
    """Everything the report shows, computed in one pass over the run directory."""

    run_dir: Path
    job: str
    model: str
    state: str
    input_path: str
    max_iters: int | None
    created_at: str | None
    updated_at: str | None
    records: int | None  # input records expected (None: the input file cannot be read)
    statuses: Mapping[str, int]  # finished records by status (done, failed)
    bad_lines: int  # input lines that could not become records (errors.jsonl)
    prompt_tokens: int
    completion_tokens: int
    calls: int
    cost_usd: float | None
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
    skipped_lines: int  # unreadable lines (a line being written while we read)

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
        if self.records is None:
            return None
        return max(0, self.records - sum(self.statuses.values()))


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

    def build(self, kind: Literal["score", "metric"], name: str, rows: int) -> Measure:
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
            kind=kind,
            name=name,
            rate=kind == "metric" and not self.nonbool,
            reached=tuple(reached),
            carried=tuple(carried),
            initial=self.initial.cell(),
            chosen=self.chosen.cell(),
        )


class _Reservoir:
    """A uniform sample of at most ``size`` values of a stream (Vitter's algorithm R)."""

    __slots__ = ("count", "items", "max", "min", "rng", "size", "total")

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: list[float] = []
        self.count = 0
        self.total = 0.0
        self.min: float | None = None
        self.max: float | None = None
        self.rng = random.Random(0)  # seeded: the same run gives the same report

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.min = value if self.min is None else min(self.min, value)
        self.max = value if self.max is None else max(self.max, value)
        if len(self.items) < self.size:
            self.items.append(value)
            return
        j = self.rng.randrange(self.count)
        if j < self.size:
            self.items[j] = value

    def freeze(self) -> Distribution:
        mean = self.total / self.count if self.count else None
        return Distribution(self.count, mean, self.min, self.max, tuple(self.items))


@dataclass(slots=True)
class _Skipped:
    lines: int = 0


def _objects(path: Path, skipped: _Skipped) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file, one at a time; a missing file holds none."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from err
    with fh:
        for raw in fh:
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                skipped.lines += 1  # a torn tail, or a line being written right now
                continue
            if isinstance(obj, dict):
                yield obj
            else:
                skipped.lines += 1


def _number(value: Any) -> tuple[float, bool] | None:
    """A finite number and whether it was a boolean; None for anything else."""
    if isinstance(value, bool):
        return (1.0 if value else 0.0), True
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value), False
    return None


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class _Quality:
    """Per-iteration sums of the score and of every evaluator metric, over done records."""

    __slots__ = ("chosen", "iterations", "reached", "refined_chosen", "series")

    def __init__(self) -> None:
        self.series: dict[Key, _Series] = {}  # metrics in first-seen order
        self.reached: list[int] = []
        self.iterations: Counter[int] = Counter()
        self.chosen: Counter[int] = Counter()
        self.refined_chosen = 0

    def add(self, rec: Mapping[str, Any]) -> None:
        scores = rec.get("scores")
        scores = scores if isinstance(scores, list) else []
        by_iteration = rec.get("metrics_by_iteration")
        by_iteration = by_iteration if isinstance(by_iteration, list) else []
        made = _int(rec.get("iterations"))
        chosen = rec.get("chosen_iteration")
        chosen = chosen if isinstance(chosen, int) and not isinstance(chosen, bool) else None
        # Answers are iterations 0..last, one per generate/refine step; scores and metrics
        # are indexed the same way (the last answer may have no score: no feedback on it).
        last = max(made, len(scores) - 1, len(by_iteration) - 1, chosen or 0)
        size = last + 1
        _grow_counts(self.reached, size)
        for t in range(size):
            self.reached[t] += 1
        self.iterations[made] += 1
        if chosen is not None:
            self.chosen[chosen] += 1
            if chosen > 0:
                self.refined_chosen += 1

        values: dict[Key, list[float | None]] = {SCORE: [None] * size}
        for t, score in enumerate(scores):
            num = _number(score)
            if num is not None:
                values[SCORE][t] = num[0]
        for t, metrics in enumerate(by_iteration):
            if not isinstance(metrics, dict):
                continue
            for name, raw in metrics.items():
                num = _number(raw)
                if num is None:
                    continue  # text (an evaluator error, an extracted answer) is not a measure
                key: Key = ("metric", str(name))
                values.setdefault(key, [None] * size)[t] = num[0]
                series = self.series.get(key)
                if series is None:
                    series = self.series[key] = _Series()
                if not num[1]:
                    series.nonbool = True
        for key, vals in values.items():
            self.series.setdefault(key, _Series()).add(vals, chosen)

    def measures(self) -> tuple[Measure, ...]:
        rows = len(self.reached)
        out = []
        for (kind, name), series in self.series.items():
            if any(m.n for m in series.reached):  # a measure no record ever had is no column
                out.append(series.build(kind, name, rows))
        out.sort(key=lambda m: m.kind != "score")  # stable: metrics keep first-seen order
        return tuple(out)


def _grow_counts(counts: list[int], size: int) -> None:
    while len(counts) < size:
        counts.append(0)


# -- one pass over the run directory -----------------------------------------------------------


def summarize(run_dir: Path, *, sample_size: int = SAMPLE_SIZE) -> RunReport:
    """Read a run directory once and compute every figure of its report."""
    rd = RunDir(Path(run_dir))
    manifest = rd.require_manifest()
    skipped = _Skipped()

    statuses: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0}
    tokens = _Reservoir(sample_size)
    quality = _Quality()
    # outputs.jsonl holds one line per id (the writer checks its keys), so lines are not
    # de-duplicated here: that would need a set of every id.
    for rec in _objects(rd.path / "outputs.jsonl", skipped):
        status = str(rec.get("status"))
        statuses[status] += 1
        reasons[str(rec.get("stop_reason"))] += 1
        used = rec.get("usage")
        used = used if isinstance(used, dict) else {}
        for k in usage:
            usage[k] += _int(used.get(k))
        tokens.add(_int(used.get("prompt_tokens")) + _int(used.get("completion_tokens")))
        if status == "done":
            quality.add(rec)

    latency: dict[str, _Reservoir] = {}
    errors: Counter[str] = Counter()
    retried: Counter[str] = Counter()
    for trace in _objects(rd.path / "traces.jsonl", skipped):
        steps = trace.get("steps")
        for step in steps if isinstance(steps, list) else []:
            if not isinstance(step, dict):
                continue
            role = str(step.get("role"))
            seconds = _number(step.get("latency_s"))
            if seconds is not None:
                if role not in latency:
                    latency[role] = _Reservoir(sample_size)
                latency[role].add(seconds[0])
            if step.get("error"):
                errors[role] += 1
            if _int(step.get("attempts"), 1) > 1:
                retried[role] += 1

    expected = rd.expected(manifest)
    order = sorted(latency, key=lambda r: (ROLES.index(r) if r in ROLES else len(ROLES), r))
    model_for = {"generate": manifest.model, "refine": manifest.model, "feedback": manifest.critic}
    spent = tally_outputs(rd.outputs_path, PriceBook(), model_for).cost_usd
    return RunReport(
        run_dir=rd.path,
        job=manifest.job.name,
        model=manifest.model,
        state=manifest.state,
        input_path=manifest.input.path,
        max_iters=manifest.settings.max_iters,
        created_at=manifest.created_at,
        updated_at=manifest.updated_at,
        records=expected.records,
        statuses=dict(statuses),
        bad_lines=expected.bad_lines,
        prompt_tokens=usage["prompt_tokens"],
        completion_tokens=usage["completion_tokens"],
        calls=usage["calls"],
        cost_usd=None if spent is None else round(spent, 6),
        rows=len(quality.reached),
        reached_records=tuple(quality.reached),
        measures=quality.measures(),
        refined_chosen=quality.refined_chosen,
        stop_reasons=dict(reasons.most_common()),
        iterations=dict(sorted(quality.iterations.items())),
        chosen_iterations=dict(sorted(quality.chosen.items())),
        tokens=tokens.freeze(),
        latency={role: latency[role].freeze() for role in order},
        step_errors=dict(errors),
        retried=dict(retried),
        skipped_lines=skipped.lines,
    )


# -- Markdown ----------------------------------------------------------------------------------


def _text(value: object) -> str:
    """Plain text safe inside a Markdown table cell."""
    return " ".join(str(value).split()).replace("|", "\\|")


def _code(value: object) -> str:
    return "`" + " ".join(str(value).split()).replace("`", "'") + "`"


def _decimals(m: Measure) -> int:
    # One precision per column, from its largest value: 0.833 and 1.000, not 0.833 and 1.
    means = [c.mean for c in (*m.carried, *m.reached, m.initial, m.chosen) if c.mean is not None]
    top = max((abs(v) for v in means), default=0.0)
    return 3 if top <= 1 else 2 if top < 100 else 0


def _value(m: Measure, value: float | None, sign: str = "") -> str:
    if value is None:
        return "-"
    # "z": a difference that rounds to nothing prints as +0.0, not -0.0.
    if m.rate:
        return f"{100 * value:{sign}z.1f}" + (" pp" if sign else "%")
    return f"{value:{sign}z,.{_decimals(m)}f}"


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _image(images: Mapping[str, str], key: str, alt: str) -> list[str]:
    return [f"![{alt}]({images[key]})", ""] if key in images else []


def _quality_section(r: RunReport, images: Mapping[str, str]) -> list[str]:
    out = ["## Quality by iteration", ""]
    if not r.done:
        return [*out, "No done records yet.", ""]
    if not r.measures:
        return [
            *out,
            "This run recorded no scores and no evaluator metrics: nothing to compare by "
            "iteration.",
            "",
        ]
    out += [
        f"Over the {r.done:,} done records. t is the number of refinements (0 is the initial "
        "answer). Each cell is a mean, with the number of records that had a value in "
        "parentheses; a (rate) column is the share of true.",
        "",
        "### (a) Carried forward: every record in every row",
        "",
        "Each record contributes its latest value at an iteration ≤ t, so a record that "
        "stopped early keeps its last answer. The population is the same in every row: the "
        "change from row to row is what more refinement buys (the Self-Refine paper's tables).",
        "",
    ]
    header = ["t", "records", *(_text(m.label) for m in r.measures)]

    def cells(m: Measure, cell: Cell) -> str:
        return "-" if cell.mean is None else f"{_value(m, cell.mean)} ({cell.n:,})"

    out += _table(
        header,
        [
            [str(t), f"{r.done:,}", *(cells(m, m.carried[t]) for m in r.measures)]
            for t in range(r.rows)
        ],
    )
    out += [
        "",
        "### (b) Reached t: only records that made at least t refinements",
        "",
        "Records leave the table once they stop, often the easy ones, so later rows describe "
        "fewer (and usually harder) records.",
        "",
    ]
    out += _table(
        header,
        [
            [str(t), f"{r.reached_records[t]:,}", *(cells(m, m.reached[t]) for m in r.measures)]
            for t in range(r.rows)
        ],
    )
    out.append("")
    for i, m in enumerate(r.measures):
        out += _image(images, f"measure-{i}", f"{m.label} by iteration")
    return out


def _changes_section(r: RunReport) -> list[str]:
    out = ["## What changed", ""]
    if not r.done:
        return [*out, "No done records yet.", ""]
    out.append(
        f"- {r.refined_chosen:,} of {r.done:,} done records "
        f"({_share(r.refined_chosen, r.done)}) kept a refined answer (chosen iteration > 0)."
    )
    for m in r.measures:
        if m.chosen.n:
            out.append(
                f"- {_text(m.label)}: initial {_value(m, m.initial.mean)}, chosen "
                f"{_value(m, m.chosen.mean)}, mean gain {_value(m, m.gain, '+')} "
                f"(over {m.chosen.n:,} records with both values)."
            )
        elif m.kind == "score":
            out.append("- score (critic): no record has a score both initially and when chosen.")
    if not any(m.kind == "score" for m in r.measures):
        out.append("- No critic scores were recorded, so no score gain.")
    return [*out, ""]


def _runs_section(r: RunReport, images: Mapping[str, str]) -> list[str]:
    finished = sum(r.stop_reasons.values())
    out = ["## Stop reasons", ""]
    if not finished:
        return [*out, "No finished records yet.", ""]
    out += _table(
        ["reason", "records", "share"],
        [[_code(k), f"{v:,}", _share(v, finished)] for k, v in r.stop_reasons.items()],
    )
    out += ["", *_image(images, "stop_reasons", "stop reasons")]
    if r.iterations:
        out += ["## Iterations per record", "", "Over the done records.", ""]
        last = max(max(r.iterations), max(r.chosen_iterations, default=0))
        out += _table(
            ["t", "records that made t refinements", "records that chose iteration t"],
            [
                [str(t), f"{r.iterations.get(t, 0):,}", f"{r.chosen_iterations.get(t, 0):,}"]
                for t in range(last + 1)
            ],
        )
        out += ["", *_image(images, "iterations", "iterations per record")]
    tk = r.tokens
    out += [
        "## Tokens per record",
        "",
        f"Prompt plus completion tokens of each finished record: mean {tk.mean or 0:,.0f}, "
        f"median {tk.quantile(0.5) or 0:,.0f}, max {tk.max or 0:,.0f}.",
        "",
        *_image(images, "tokens", "tokens per record"),
    ]
    return out


def _latency_section(r: RunReport, images: Mapping[str, str]) -> list[str]:
    out = ["## Call latency by role", ""]
    if not r.latency:
        return [*out, "No traces yet.", ""]
    rows = [
        [
            _code(role),
            f"{d.count:,}",
            _seconds(d.mean),
            _seconds(d.quantile(0.5)),
            _seconds(d.quantile(0.9)),
            _seconds(d.quantile(0.99)),
            _seconds(d.max),
            f"{r.retried.get(role, 0):,}",
            f"{r.step_errors.get(role, 0):,}",
        ]
        for role, d in r.latency.items()
    ]
    out += _table(
        ["role", "calls", "mean", "p50", "p90", "p99", "max", "retried", "with error"], rows
    )
    out.append("")
    if any(d.count > len(d.sample) for d in r.latency.values()):
        out += [
            "Percentiles come from a uniform sample of "
            f"{max(len(d.sample) for d in r.latency.values()):,} calls per role; counts, "
            "means and maxima are exact.",
            "",
        ]
    return out + _image(images, "latency", "call latency by role")


def render_markdown(report: RunReport, images: Mapping[str, str] | None = None) -> str:
    """The report as GitHub-flavoured Markdown; ``images`` maps plot keys to relative paths."""
    r = report
    imgs = images or {}
    pending = (
        "pending unknown (the input file cannot be read)"
        if r.pending is None
        else f"{r.pending:,} pending (of {r.records:,})"
    )
    others = {k: v for k, v in r.statuses.items() if k not in ("done", "failed")}
    finished = f"{r.done:,} done, {r.failed:,} failed" + "".join(
        f", {v:,} {_text(k)}" for k, v in others.items()
    )
    cost_text = "unknown (no price for this model)" if r.cost_usd is None else f"${r.cost_usd:.4f}"
    when = " to ".join(_text(t) for t in (r.created_at, r.updated_at) if t)
    out = [
        f"# Run report: {_text(r.job)}",
        "",
        *_table(
            ["", ""],
            [
                ["run directory", _code(r.run_dir)],
                ["job", _code(r.job)],
                ["model", _code(r.model)],
                ["state", _text(r.state) + (f" ({when})" if when else "")],
                ["input", _code(r.input_path)],
                [
                    "records",
                    f"{finished}, {pending}",
                ],
                ["unreadable input lines", f"{r.bad_lines:,} (errors.jsonl)"],
                [
                    "tokens",
                    f"{r.prompt_tokens:,} prompt + {r.completion_tokens:,} completion "
                    f"in {r.calls:,} calls",
                ],
                ["cost", cost_text],
                ["max iterations", "-" if r.max_iters is None else str(r.max_iters)],
            ],
        ),
        "",
    ]
    if r.skipped_lines:
        out += [
            f"{r.skipped_lines:,} unreadable line(s) were skipped (a run still writing, or a "
            "torn tail that the next run repairs).",
            "",
        ]
    out += _quality_section(r, imgs)
    out += _changes_section(r)
    out += _runs_section(r, imgs)
    out += _latency_section(r, imgs)
    out.append(f"Generated {now_iso()} by `refine report`.")
    return "\n".join(out) + "\n"


# -- plots -------------------------------------------------------------------------------------


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ConfigError(f"refine report draws its plots with matplotlib: {INSTALL_HINT}") from err
    return Figure


def _plain(text: str) -> str:
    # `$` starts matplotlib's mathtext: a metric named "cost_$" must print as written.
    return text.replace("$", r"\$")


def _save(fig: Figure, path: Path) -> None:
    # A bare Figure (no pyplot) draws PNG with the Agg canvas and never touches the global
    # backend, so reports can be written from notebooks, threads and servers alike.
    fig.savefig(path, format="png", dpi=DPI)


def _whole_numbers(axis: Axis) -> None:
    """Ticks at whole numbers only: the axis counts records."""
    from matplotlib.ticker import MaxNLocator  # matplotlib is known to be there by now

    axis.set_major_locator(MaxNLocator(integer=True))


def _new(figure: type[Figure]) -> tuple[Figure, Axes]:
    fig = figure(figsize=FIGSIZE, layout="constrained")
    return fig, fig.add_subplot()


def _plot_measure(figure: type[Figure], m: Measure, rows: int, path: Path) -> None:
    fig, ax = _new(figure)
    ts = list(range(rows))
    scale = 100.0 if m.rate else 1.0
    for cells, style, label in (
        (m.carried, "-o", "carried forward (every record)"),
        (m.reached, "--s", "reached t only"),
    ):
        xs = [t for t in ts if cells[t].mean is not None]
        ys = [(cells[t].mean or 0.0) * scale for t in xs]
        ax.plot(xs, ys, style, label=label)
    ax.set_xticks(ts)
    ax.set_xlabel("t (refinements)")
    ax.set_ylabel(_plain(f"{m.name} (% true)" if m.rate else m.name))
    ax.set_title(_plain(f"{m.label} by iteration"))
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)


def _plot_stop_reasons(figure: type[Figure], reasons: Mapping[str, int], path: Path) -> None:
    fig, ax = _new(figure)
    names = list(reasons)[::-1]  # most frequent on top
    bars = ax.barh(names, [reasons[n] for n in names])
    ax.bar_label(bars, padding=2)
    _whole_numbers(ax.xaxis)
    ax.set_xlabel("records")
    ax.set_title("Stop reasons")
    ax.margins(x=0.15)
    _save(fig, path)


def _plot_iterations(
    figure: type[Figure], made: Mapping[int, int], chosen: Mapping[int, int], path: Path
) -> None:
    fig, ax = _new(figure)
    ts = list(range(max(max(made), max(chosen, default=0)) + 1))
    width = 0.4
    ax.bar(
        [t - width / 2 for t in ts], [made.get(t, 0) for t in ts], width, label="refinements made"
    )
    ax.bar(
        [t + width / 2 for t in ts], [chosen.get(t, 0) for t in ts], width, label="chosen iteration"
    )
    ax.set_xticks(ts)
    ax.set_xlabel("t")
    _whole_numbers(ax.yaxis)
    ax.set_ylabel("done records")
    ax.set_title("Refinements made and iteration chosen, per record")
    ax.legend()
    _save(fig, path)


def _plot_tokens(figure: type[Figure], tokens: Distribution, path: Path) -> None:
    fig, ax = _new(figure)
    ax.hist(tokens.sample, bins=min(40, max(1, len(set(tokens.sample)))))
    ax.set_xlabel("prompt + completion tokens")
    _whole_numbers(ax.yaxis)
    ax.set_ylabel("records" if tokens.count == len(tokens.sample) else "records (sample)")
    ax.set_title("Tokens per record")
    _save(fig, path)


def _plot_latency(figure: type[Figure], latency: Mapping[str, Distribution], path: Path) -> None:
    fig, ax = _new(figure)
    roles = list(latency)
    ax.boxplot([list(latency[r].sample) for r in roles])
    ax.set_xticks(range(1, len(roles) + 1), roles)
    lows = [d.min for d in latency.values() if d.min is not None]
    highs = [d.max for d in latency.values() if d.max is not None]
    # Latencies are long-tailed: a log axis keeps the boxes readable next to the outliers.
    if lows and min(lows) > 0 and max(highs) / min(lows) >= 50:
        ax.set_yscale("log")
    ax.set_ylabel("seconds per call")
    ax.set_title("Call latency by role")
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "metric"


def _plot_all(figure: type[Figure], r: RunReport, out: Path) -> dict[str, str]:
    """Draw every plot that has data into ``out``; map plot keys to file names."""
    names: dict[str, str] = {}
    used: set[str] = set()

    def name(key: str, stem: str) -> Path:
        base, n = stem, 2
        while stem in used:
            stem, n = f"{base}-{n}", n + 1
        used.add(stem)
        names[key] = f"{stem}.png"
        return out / names[key]

    if r.done:
        for i, m in enumerate(r.measures):
            stem = "by-iteration-score" if m.kind == "score" else f"by-iteration-{_slug(m.name)}"
            _plot_measure(figure, m, r.rows, name(f"measure-{i}", stem))
        _plot_iterations(
            figure, r.iterations, r.chosen_iterations, name("iterations", "iterations")
        )
    if r.stop_reasons:
        _plot_stop_reasons(figure, r.stop_reasons, name("stop_reasons", "stop-reasons"))
    if r.tokens.count:
        _plot_tokens(figure, r.tokens, name("tokens", "tokens-per-record"))
    if r.latency:
        _plot_latency(figure, r.latency, name("latency", "latency-by-role"))
    return names


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write ``report.md`` and its PNG plots into ``out`` (default ``RUN_DIR/report``).

    Returns the Markdown file's path. Raises ConfigError when matplotlib is missing or
    ``run_dir`` holds no run, StoreError when ``out`` cannot be written.
    """
    figure = _figure_class()  # before reading a large run, so a missing extra fails fast
    report = summarize(Path(run_dir))
    target = Path(out) if out is not None else report.run_dir / "report"
    path = target / "report.md"
    try:
        target.mkdir(parents=True, exist_ok=True)
        images = _plot_all(figure, report, target)
        path.write_text(render_markdown(report, images), encoding="utf-8")
    except OSError as err:
        raise StoreError(f"cannot write the report into {target}: {err.strerror}") from err
    return path
