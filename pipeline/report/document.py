"""The report's text as plain blocks (headings, paragraphs, lists, tables, plots).

Both the Markdown file and the HTML page render these same blocks, so the two say the
same thing in the same words; only the markup differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..runs.manifest import now_iso
from .aggregate import Cell, Measure, RunReport, Spend
from .flips import Change, MetricFlips, Round
from .payoff import Rates, reasoning, recommend

__all__ = [
    "Block",
    "Bullets",
    "Heading",
    "Image",
    "Para",
    "Table",
    "Text",
    "Verbatim",
    "build",
    "dollars",
    "measure_value",
    "seconds",
    "share",
]


@dataclass(frozen=True, slots=True)
class Verbatim:
    """A literal (a file name, a stop reason, a command), shown in a fixed-width font."""

    text: str


Inline = str | Verbatim
Text = Inline | tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Heading:
    """A section title; ``anchor`` names it in the page's table of contents."""

    level: int
    text: Text
    anchor: str | None = None


@dataclass(frozen=True, slots=True)
class Para:
    """A paragraph."""

    text: Text


@dataclass(frozen=True, slots=True)
class Bullets:
    """A bulleted list."""

    items: tuple[Text, ...]


@dataclass(frozen=True, slots=True)
class Table:
    """A table with a header row."""

    header: tuple[Text, ...]
    rows: tuple[tuple[Text, ...], ...]


@dataclass(frozen=True, slots=True)
class Image:
    """A plot, by key; a renderer leaves out a plot that was not drawn."""

    key: str
    alt: str


Block = Heading | Para | Bullets | Table | Image

NO_DONE: Final = Para("No done records yet.")


# -- numbers -----------------------------------------------------------------------------------


def _decimals(m: Measure) -> int:
    # One precision per column, from its largest value: 0.833 and 1.000, not 0.833 and 1.
    means = [c.mean for c in (*m.carried, *m.reached, m.initial, m.chosen) if c.mean is not None]
    top = max((abs(v) for v in means), default=0.0)
    return 3 if top <= 1 else 2 if top < 100 else 0


def measure_value(m: Measure, value: float | None, sign: str = "") -> str:
    """A value of the measure as printed: a percentage for rates, else its column's precision."""
    if value is None:
        return "-"
    # "z": a difference that rounds to nothing prints as +0.0, not -0.0.
    if m.rate:
        return f"{100 * value:{sign}z.1f}" + (" pp" if sign else "%")
    return f"{value:{sign}z,.{_decimals(m)}f}"


def share(part: int, whole: int) -> str:
    """``part`` as a percentage of ``whole``."""
    return f"{100 * part / whole:.1f}%" if whole else "-"


def seconds(value: float | None) -> str:
    """A duration in ms below a second, else in seconds."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def dollars(value: float | None) -> str:
    """An amount in US dollars, to a hundredth of a cent."""
    return "unknown" if value is None else f"${value:.4f}"


def _spend(s: Spend) -> str:
    if not s.calls:
        return "-"
    if s.unknown:
        return f"unknown ({s.unknown:,} of {s.calls:,} calls unpriced)"
    return dollars(s.dollars)


# -- sections ----------------------------------------------------------------------------------


def _tiers(r: RunReport) -> str:
    """The service tiers that served the calls (flex at the batch rate), where they said."""
    return "; " + ", ".join(f"{n:,} calls on {t}" for t, n in r.tiers.items()) if r.tiers else ""


def _cost(r: RunReport) -> str:
    if r.cost_usd is None:
        return "unknown (no price for this model)"
    if r.cost_unknown:
        return f"{dollars(r.cost_usd)} for the priced records; {r.cost_unknown:,} unknown"
    return dollars(r.cost_usd)


def _header(r: RunReport) -> list[Block]:
    run = r.run
    pending = (
        "pending unknown (the input file cannot be read)"
        if r.pending is None
        else f"{r.pending:,} pending (of {run.records:,})"
    )
    others = {k: v for k, v in r.statuses.items() if k not in ("done", "failed")}
    finished = f"{r.done:,} done, {r.failed:,} failed" + "".join(
        f", {v:,} {k}" for k, v in others.items()
    )
    when = " to ".join(t for t in (run.created_at, run.updated_at) if t)
    out: list[Block] = [
        Heading(1, f"Run report: {run.job}"),
        Table(
            ("", ""),
            (
                ("run directory", Verbatim(str(run.run_dir))),
                ("job", Verbatim(run.job)),
                ("model", Verbatim(run.model)),
                ("state", run.state + (f" ({when})" if when else "")),
                ("input", Verbatim(run.input_path)),
                ("records", f"{finished}, {pending}"),
                ("unreadable input lines", f"{run.bad_lines:,} (errors.jsonl)"),
                (
                    "tokens",
                    f"{r.prompt_tokens:,} prompt ({r.cached_tokens:,} from the provider's cache"
                    + (f", {r.cache_write_tokens:,} written to it" if r.cache_write_tokens else "")
                    + f") + {r.completion_tokens:,} completion in {r.calls:,} calls",
                ),
                ("cost", _cost(r) + _tiers(r)),
                ("max iterations", "-" if run.max_iters is None else str(run.max_iters)),
                *(
                    (f"hook {h} failed", f"on {n:,} answer(s) (traces.jsonl: hook_errors)")
                    for h, n in r.hook_errors.items()
                ),
            ),
        ),
    ]
    if r.skipped_lines:
        out.append(
            Para(
                f"{r.skipped_lines:,} unreadable line(s) were skipped (a run still writing, or "
                "a torn tail that the next run repairs)."
            )
        )
    return out


def _cells(m: Measure, cell: Cell) -> str:
    return "-" if cell.mean is None else f"{measure_value(m, cell.mean)} ({cell.n:,})"


def _quality(r: RunReport) -> list[Block]:
    out: list[Block] = [Heading(2, "Quality by iteration", "quality")]
    if not r.done:
        return [*out, NO_DONE]
    if not r.measures:
        return [
            *out,
            Para(
                "This run recorded no scores and no evaluator metrics: nothing to compare by "
                "iteration."
            ),
        ]
    header = ("t", "records", *(m.label for m in r.measures))
    out += [
        Para(
            f"Over the {r.done:,} done records. t is the number of refinements (0 is the "
            "initial answer). Each cell is a mean, with the number of records that had a value "
            "in parentheses; a (rate) column is the share of true."
        ),
        Heading(3, "(a) Carried forward: every record in every row"),
        Para(
            "Each record contributes its latest value at an iteration ≤ t, so a record that "
            "stopped early keeps its last answer. The population is the same in every row: the "
            "change from row to row is what more refinement buys (the Self-Refine paper's "
            "tables)."
        ),
        Table(
            header,
            tuple(
                (str(t), f"{r.done:,}", *(_cells(m, m.carried[t]) for m in r.measures))
                for t in range(r.rows)
            ),
        ),
        Heading(3, "(b) Reached t: only records that made at least t refinements"),
        Para(
            "Records leave the table once they stop, often the easy ones, so later rows "
            "describe fewer (and usually harder) records."
        ),
        Table(
            header,
            tuple(
                (
                    str(t),
                    f"{r.reached_records[t]:,}",
                    *(_cells(m, m.reached[t]) for m in r.measures),
                )
                for t in range(r.rows)
            ),
        ),
    ]
    out += [Image(f"measure-{i}", f"{m.label} by iteration") for i, m in enumerate(r.measures)]
    return out


def _changes(r: RunReport) -> list[Block]:
    out: list[Block] = [Heading(2, "What changed", "changes")]
    if not r.done:
        return [*out, NO_DONE]
    items: list[Text] = [
        f"{r.refined_chosen:,} of {r.done:,} done records ({share(r.refined_chosen, r.done)}) "
        "kept a refined answer (chosen iteration > 0)."
    ]
    for m in r.measures:
        if m.chosen.n:
            items.append(
                f"{m.label}: initial {measure_value(m, m.initial.mean)}, chosen "
                f"{measure_value(m, m.chosen.mean)}, mean gain {measure_value(m, m.gain, '+')} "
                f"(over {m.chosen.n:,} records with both values)."
            )
        elif m.measured == "score":
            items.append("score (critic): no record has a score both initially and when chosen.")
    if not any(m.measured == "score" for m in r.measures):
        items.append("No critic scores were recorded, so no score gain.")
    return [*out, Bullets(tuple(items))]


def _rate(part: int, whole: int) -> str:
    return f"{share(part, whole)} ({part:,}/{whole:,})" if whole else "-"


def _flip_row(name: str, r: Round) -> tuple[Text, ...]:
    def counts(c: Change) -> tuple[str, ...]:
        return (f"{c.better:,}", f"{c.worse:,}", f"{c.same:,}")

    chosen = r.t is None
    row: tuple[Text, ...] = (
        name,
        f"{r.vs_first.n:,}",
        *(("-", "-", "-") if chosen else counts(r.vs_previous)),
        *counts(r.vs_first),
    )
    rates: Rates | None = r.rates
    if rates is None:
        return row
    return (
        *row,
        _rate(rates.right_after, rates.n),
        _rate(rates.fixed, rates.wrong_before),
        _rate(rates.broken, rates.right_before),
        "-" if chosen else ("yes" if rates.pays else "no"),
    )


def _metric_flips(m: MetricFlips) -> list[Block]:
    header: tuple[Text, ...] = ("t", "records", "better than t-1", "worse than t-1", "same as t-1")
    header += ("better than first", "worse than first", "same as first")
    if m.boolean:
        header += ("right", "correction", "introduction", "round pays")
    rows = tuple(_flip_row(str(r.t), r) for r in m.rounds)
    out: list[Block] = [
        Heading(3, m.label),
        Table(header, (*rows, _flip_row("chosen", m.chosen))),
    ]
    if m.boolean:
        rounds = [r.rates for r in m.rounds if r.rates is not None]
        why = reasoning(rounds)
        out.append(
            Para(f"Refinements that pay by the rule: {recommend(rounds)}. {why[0]}; {why[1]}.")
        )
    return out


def _flips(r: RunReport) -> list[Block]:
    out: list[Block] = [Heading(2, "Flips by round", "flips")]
    f = r.flips
    if f is None or not r.done:
        return [*out, NO_DONE]
    out.append(
        Para(
            "Per metric with a better direction (a boolean: true; a number: as the job "
            "declares), over the done records, a record that stopped keeping its last answer. "
            "Row t counts the records round t made better, worse or left the same (against "
            "t-1), and where they stand against their first answer; the chosen row compares "
            "the output with the first answer. For a right-or-wrong metric: right at t, "
            "correction = wrong at t-1 and right at t, over wrong at t-1; introduction = "
            "right at t-1 and wrong at t, over right at t-1; a round pays while "
            "correction/introduction > Acc/(1-Acc) at t-1, that is while it fixes more "
            "answers than it breaks."
        )
    )
    for m in f.metrics:
        out += _metric_flips(m)
    if not f.metrics:
        out.append(Para("No metric with a better direction was recorded."))
    if f.undirected:
        out.append(Para(f"No better direction, so no flips: {', '.join(f.undirected)}."))
    if f.job_problem:
        out.append(Para(f"Note: {f.job_problem}."))
    if f.ranks is not None and f.ranks.compared:
        k = f.ranks
        out.append(
            Para(
                f"The job's checks (which read no label) rank the chosen output below the first "
                f"answer in {k.below:,} of {k.compared:,} records (0 expected)."
            )
        )
    if f.ranks is not None and f.ranks.unmarked:
        out.append(
            Para(f"{f.ranks.unmarked:,} trace(s) mark no first or chosen answer: not ranked.")
        )
    return out


def _per_dollar(r: RunReport, m: Measure, t: int) -> str:
    value = r.gain_per_dollar(m, t)
    if value is None:
        return "-"
    return f"{100 * value:+,.1f} pp" if m.rate else f"{value:+,.{_decimals(m)}f}"


def _costs(r: RunReport) -> list[Block]:
    if not r.priced:
        return []
    rows = max(r.rows, len(r.answer_spend), len(r.feedback_spend))
    shown = [m for m in r.measures if r.done]
    return [
        Heading(2, "Cost by iteration", "cost"),
        Para(
            "Dollars of the traced calls of every finished record, each call at its model's "
            "price. Iteration t is its answer (generate or refine) and the feedback on it; "
            "refinement t is the feedback on answer t-1 plus the refine call that wrote answer "
            "t. A per-$ column is the carried-forward gain from t-1 to t, summed over the done "
            "records, per dollar refinement t cost: what the next dollar of refinement bought."
        ),
        Table(
            (
                "t",
                "calls",
                "iteration t",
                "refinement t",
                *(f"{m.label} gain per $" for m in shown),
            ),
            tuple(
                (
                    str(t),
                    f"{r.spend(t).calls:,}",
                    _spend(r.spend(t)),
                    "-" if t == 0 else _spend(r.step_spend(t)),
                    *(_per_dollar(r, m, t) for m in shown),
                )
                for t in range(rows)
            ),
        ),
    ]


def _runs(r: RunReport) -> list[Block]:
    finished = sum(r.stop_reasons.values())
    out: list[Block] = [Heading(2, "Stop reasons", "stops")]
    if not finished:
        return [*out, Para("No finished records yet.")]
    out += [
        Table(
            ("reason", "records", "share"),
            tuple((Verbatim(k), f"{v:,}", share(v, finished)) for k, v in r.stop_reasons.items()),
        ),
        Image("stop_reasons", "stop reasons"),
    ]
    if r.iterations:
        last = max(max(r.iterations), max(r.chosen_iterations, default=0))
        out += [
            Heading(2, "Iterations per record", "iterations"),
            Para("Over the done records."),
            Table(
                ("t", "records that made t refinements", "records that chose iteration t"),
                tuple(
                    (str(t), f"{r.iterations.get(t, 0):,}", f"{r.chosen_iterations.get(t, 0):,}")
                    for t in range(last + 1)
                ),
            ),
            Image("iterations", "iterations per record"),
        ]
    tk = r.tokens
    return [
        *out,
        Heading(2, "Tokens per record", "tokens"),
        Para(
            f"Prompt plus completion tokens of each finished record: mean {tk.mean or 0:,.0f}, "
            f"median {tk.quantile(0.5) or 0:,.0f}, max {tk.max or 0:,.0f}."
        ),
        Image("tokens", "tokens per record"),
    ]


_STRATEGY_CALL_KINDS = ("sample", "restart", "copy_retry")


def _latency(r: RunReport) -> list[Block]:
    out: list[Block] = [Heading(2, "Call latency by role", "latency")]
    if not r.latency:
        return [*out, Para("No traces yet.")]
    out.append(
        Table(
            ("role", "calls", "mean", "p50", "p90", "p99", "max", "retried", "with error"),
            tuple(
                (
                    Verbatim(role),
                    f"{d.count:,}",
                    seconds(d.mean),
                    seconds(d.quantile(0.5)),
                    seconds(d.quantile(0.9)),
                    seconds(d.quantile(0.99)),
                    seconds(d.max),
                    f"{r.retried.get(role, 0):,}",
                    f"{r.step_errors.get(role, 0):,}",
                )
                for role, d in r.latency.items()
            ),
        )
    )
    if r.call_kinds:
        kinds = ", ".join(f"{kind} {n:,}" for kind, n in r.call_kinds.items())
        strategies = sum(n for kind, n in r.call_kinds.items() if kind in _STRATEGY_CALL_KINDS)
        extra = f"{strategies:,} from opt-in strategies" if strategies else "none from a strategy"
        out.append(Para(f"Calls by kind: {kinds} ({extra}; repair re-asks a cut-off call)."))
    if any(d.count > len(d.sample) for d in r.latency.values()):
        out.append(
            Para(
                "Percentiles come from a uniform sample of "
                f"{max(len(d.sample) for d in r.latency.values()):,} calls per role; counts, "
                "means and maxima are exact."
            )
        )
    return [*out, Image("latency", "call latency by role")]


def build(report: RunReport) -> list[Block]:
    """The report's blocks in reading order."""
    return [
        *_header(report),
        *_quality(report),
        *_changes(report),
        *_flips(report),
        *_costs(report),
        *_runs(report),
        *_latency(report),
        Para(("Generated ", now_iso(), " by ", Verbatim("refine report"), ".")),
    ]
