"""``calibration.json``: what ``refine calibrate`` measured, and how a later run reads it.

Two measures, both over the same labelled sample. **Rounds** (from the refine arm's run):
the accuracy at each iteration, each round's flips, correction and introduction rates, and
the rule of :mod:`pipeline.report.payoff`; its recommendation, the leading rounds that pay,
is what ``refine run --max-iters auto`` reads. **Arms** (:mod:`.arms`): Self-Refine,
best-of-n at the same calls per record, and the first answer, each right or wrong on every
record, compared by :mod:`pipeline.report.comparison`; its recommendation, an arm, is what
``refine run --plan auto`` runs, with the arm's own ``--max-iters`` and strategies.

``version`` 1 files (before the arms) hold the rounds only: ``--max-iters auto`` reads
them as before, ``--plan`` refuses them, naming the way out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from ..core.jobs import Job
from ..core.loader import load_job
from ..errors import ConfigError
from ..report.aggregate import RunReport, summarize
from ..report.comparison import compare, reasoning
from ..report.flips import Change, MetricFlips
from ..report.payoff import Rates
from ..report.payoff import reasoning as rounds_reasoning
from ..report.payoff import recommend as rounds_recommend
from ..report.significance import ALPHA, POWER
from ..runs.settings import Settings
from .arms import Arm, Spent, figures

__all__ = [
    "AUTO",
    "CALIBRATION",
    "VERSION",
    "Calibration",
    "Plan",
    "measure",
    "measure_arms",
    "pick_metric",
    "read_calibration",
    "recommended_iters",
    "recommended_plan",
    "render",
]

CALIBRATION: Final = "calibration.json"
VERSION: Final = 2  # 2: the arms at equal budget; 1: the rounds only
AUTO: Final = "auto"  # --plan auto: the arm the comparison recommends


@dataclass(frozen=True, slots=True)
class Plan:
    """How an arm runs: the refinements, the strategy specs over the job's own, and the loop
    options it was calibrated with."""

    arm: str
    max_iters: int
    strategy: tuple[str, ...]
    min_iters: int = 0
    checks: bool = True
    repair: bool | None = None
    select: str | None = None

    @classmethod
    def of(cls, arm: str, max_iters: int, strategy: tuple[str, ...], settings: Settings) -> Plan:
        """The plan of ``arm``, with the loop options of ``settings``."""
        s = settings
        return cls(arm, max_iters, strategy, s.min_iters, s.checks, s.repair, s.select)

    @property
    def loop(self) -> dict[str, Any]:
        """The Settings fields the plan sets besides ``max_iters``."""
        return {
            "strategy": self.strategy,
            "min_iters": self.min_iters,
            "checks": self.checks,
            "repair": self.repair,
            "select": self.select,
        }

    def to_json(self) -> dict[str, Any]:
        """The ``plan`` object of an arm in ``calibration.json``."""
        return {"max_iters": self.max_iters, **self.loop, "strategy": list(self.strategy)}

    @classmethod
    def from_json(cls, arm: str, data: dict[str, Any]) -> Plan:
        """An arm's ``plan`` object (KeyError, TypeError or ValueError when it is not one)."""
        return cls(
            arm,
            int(data["max_iters"]),
            tuple(str(x) for x in data["strategy"]),
            int(data.get("min_iters", 0)),
            bool(data.get("checks", True)),
            data.get("repair"),
            data.get("select"),
        )


@dataclass(frozen=True, slots=True)
class Calibration:
    """What ``calibration.json`` holds (``data``), with the fields a later run checks."""

    job: str
    job_hash: str
    model: str
    recommendation: int | None  # refinements that pay (None: the refine arm was not run)
    data: dict[str, Any]

    @property
    def version(self) -> int:
        """The file's version (1: rounds only)."""
        value = self.data.get("version", 1)
        return value if isinstance(value, int) else 1

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> Calibration:
        """Read a ``calibration.json`` object; ConfigError when it is not one."""
        try:
            job = data["job"]
            recommendation = data.get("recommendation")
            if recommendation is not None and (
                not isinstance(recommendation, int) or recommendation < 0
            ):
                raise ValueError(f"recommendation {recommendation!r}")
            return cls(str(job["name"]), str(job["hash"]), str(data["model"]), recommendation, data)
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"{where}: not a calibration of refine ({err!r})") from err

    def plan(self, arm: str, where: str) -> Plan:
        """The plan of ``arm`` (``auto``: the recommended one); ConfigError without it."""
        if self.version < 2 or not isinstance(self.data.get("arms"), list):
            raise ConfigError(
                f"{where} was written before calibrate compared arms (version {self.version}): "
                "calibrate again into a new --out to compare them, or use --max-iters auto"
            )
        name = self.data["comparison"]["recommended"] if arm == AUTO else arm
        for entry in self.data["arms"]:
            if entry.get("name") == name:
                try:
                    return Plan.from_json(name, entry["plan"])
                except (KeyError, TypeError, ValueError) as err:
                    raise ConfigError(f"{where}: arm {name} has no plan ({err!r})") from err
        known = ", ".join(str(e.get("name")) for e in self.data["arms"])
        raise ConfigError(f"--plan {arm}: {where} calibrated the arms {known}, not {name}")


def read_calibration(directory: str | Path) -> Calibration:
    """The calibration a ``refine calibrate --out DIR`` wrote (ConfigError without one)."""
    path = Path(directory) / CALIBRATION
    try:
        raw = path.read_bytes()
    except FileNotFoundError as err:
        raise ConfigError(
            f"no {CALIBRATION} in {directory}: run `refine calibrate JOB SAMPLE --out "
            f"{directory}` first (or give --max-iters a number)"
        ) from err
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from err
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise ConfigError(f"{path}: not JSON ({err})") from err
    return Calibration.from_json(data if isinstance(data, dict) else {}, str(path))


def _fitting(directory: str | Path, job: Job | str, model: str | None) -> Calibration:
    """The calibration in ``directory``, refused when it is of another job, version or model."""
    cal = read_calibration(directory)
    job = load_job(job) if isinstance(job, str) else job
    if (cal.job, cal.job_hash) != (job.name, job.content_hash):
        raise ConfigError(
            f"{directory} calibrated job {cal.job!r} (hash {cal.job_hash[:12]}), not "
            f"{job.name!r} (hash {job.content_hash[:12]}): calibrate this job again"
        )
    if model is not None and cal.model.split(" (critic:")[0] != model:
        raise ConfigError(
            f"{directory} calibrated model {cal.model!r}, not {model!r}: calibrate this model"
        )
    return cal


def recommended_iters(directory: str | Path, job: Job | str, model: str | None = None) -> int:
    """The refinements ``refine calibrate`` recommended for ``job`` (and ``model``, when given).

    ConfigError when the calibration is of another job, of another version of its files,
    or of another model: its rates say nothing about those.
    """
    cal = _fitting(directory, job, model)
    if cal.recommendation is None:
        raise ConfigError(
            f"{directory} measured no rounds (its arms did not include refine): use "
            f"--plan auto --calibration {directory}, or give --max-iters a number"
        )
    return cal.recommendation


def recommended_plan(
    directory: str | Path, job: Job | str, model: str | None = None, arm: str = AUTO
) -> Plan:
    """The plan of the arm ``refine calibrate`` recommended (or of the arm named)."""
    return _fitting(directory, job, model).plan(arm, str(Path(directory) / CALIBRATION))


# -- the rounds --------------------------------------------------------------------------------


def pick_metric(report: RunReport, job: Job, metric: str | None) -> MetricFlips:
    """The metric to judge by: ``metric``, else the first boolean from a label, else the first
    boolean, among those the run measured."""
    found = [] if report.flips is None else [m for m in report.flips.metrics if m.boolean]
    if metric is not None:
        chosen = next((m for m in found if m.name == metric), None)
        if chosen is None:
            known = ", ".join(m.name for m in found) or "none"
            raise ConfigError(f"--metric {metric}: no right-or-wrong metric of that name ({known})")
        return chosen
    labelled = [m for m in found if m.source == "label"]
    if labelled or found:
        return (labelled or found)[0]
    labels = [f.name for f in job.inputs if f.use == "label"]
    hint = f": do the records carry {', '.join(labels)}?" if labels else ""
    raise ConfigError(f"the sample measured no right-or-wrong metric to calibrate by{hint}")


def _change(c: Change) -> dict[str, int]:
    return {"better": c.better, "worse": c.worse, "same": c.same}


def _rates(r: Rates) -> dict[str, Any]:
    return {
        "n": r.n,
        "right_before": r.right_before,
        "fixed": r.fixed,
        "broken": r.broken,
        "correction": r.correction,
        "introduction": r.introduction,
        "threshold": r.threshold,
        "pays": r.pays,
    }


def _per_record(value: float | None, records: int) -> float | None:
    return None if value is None or not records else value / records


def measure(run_dir: Path, job: Job, *, metric: str | None = None) -> dict[str, Any]:
    """The rounds of a finished refine run, as ``calibration.json`` holds them."""
    report = summarize(run_dir)
    m = pick_metric(report, job, metric)
    finished = report.done + report.failed
    rounds = [r.rates for r in m.rounds if r.rates is not None]
    first = report.step_spend(0)  # the generate calls (no feedback comes before them)
    rows = []
    for r in m.rounds:
        assert r.rates is not None and r.t is not None  # a boolean metric's rounds have rates
        spend = report.step_spend(r.t)
        rows.append(
            {
                "t": r.t,
                **_rates(r.rates),
                "vs_previous": _change(r.vs_previous),
                "vs_first": _change(r.vs_first),
                "calls_per_record": _per_record(spend.calls, finished),
                "cost_per_record": _per_record(spend.known, finished),
            }
        )
    assert m.chosen.rates is not None
    return {
        "version": VERSION,
        "job": {"name": job.name, "hash": job.content_hash},
        "model": report.run.model,
        "max_iters": report.run.max_iters,
        "input": report.run.input_path,
        "metric": {"name": m.name, "source": m.source},
        "records": {"done": report.done, "failed": report.failed},
        "accuracy": [
            {"t": t, "right": right, "n": n, "share": right / n if n else None}
            for t, (right, n) in enumerate(m.right)
        ],
        "generate": {  # iteration 0: the first answers
            "calls_per_record": _per_record(first.calls, finished),
            "cost_per_record": _per_record(first.known, finished),
        },
        "rounds": rows,
        "chosen": {**_rates(m.chosen.rates), "vs_first": _change(m.chosen.vs_first)},
        "calls_per_record": _per_record(report.calls, finished),
        "cost_per_record": _per_record(report.cost_usd, finished)
        if not report.cost_unknown
        else None,
        "recommendation": rounds_recommend(rounds),
        "reasoning": list(rounds_reasoning(rounds)),
    }


# -- the arms ----------------------------------------------------------------------------------


def measure_arms(
    spent: Mapping[Arm, Spent],
    plans: Mapping[Arm, Plan],
    run_dirs: Mapping[Arm, Sequence[str]],
    samples: Mapping[int, int],
) -> dict[str, Any]:
    """The arms' table and the comparison, as ``calibration.json`` holds them.

    ``samples``: best-of-n's records by the drafts each got; ``run_dirs``: each arm's run
    directories, relative to the calibration's.
    """
    ids = sorted({rid for s in spent.values() for rid, v in s.values.items() if v is not None})
    figs = [figures(str(arm), spent[arm], ids) for arm in spent]
    verdict = compare(figs)
    base = spent.get(Arm.REFINE)
    rows = []
    for arm, fig in zip(spent, figs, strict=True):
        s = spent[arm]
        lo, hi = fig.interval
        row: dict[str, Any] = {
            "name": str(arm),
            "plan": plans[arm].to_json(),
            "run_dirs": list(run_dirs[arm]),
            "records": s.records,
            "measured": fig.n,
            "right": fig.right_count,
            "accuracy": fig.accuracy,
            "interval": [lo, hi],
            "calls_per_record": fig.calls,
            "tokens_per_record": fig.tokens,
            "cached_tokens_per_record": s.per_record(s.cached_tokens),
            "cost_per_record": fig.dollars,
            "cost_usd": s.dollars,
        }
        if arm is Arm.BEST_OF_N:
            row["samples"] = {str(n): count for n, count in sorted(samples.items())}
            if base is not None and base.calls:
                row["calls_vs_refine"] = (s.calls / s.records) / (base.calls / base.records)
        if arm is Arm.FIRST and Arm.REFINE in spent:
            row["from"] = "iteration 0 of refine"
        rows.append(row)
    pairs = [
        {
            "arm": p.arm,
            "against": p.against,
            "n": p.n,
            "arm_only_right": p.wins,
            "against_only_right": p.losses,
            "p_value": p.p_value,
            "worse": p.worse,
            "needed": p.needed,
        }
        for p in verdict.against_best
    ]
    return {
        "arms": rows,
        "comparison": {
            "test": "McNemar exact, two-sided, paired over the measured records",
            "alpha": ALPHA,
            "power": POWER,
            "cost_by": str(verdict.basis),
            "best": verdict.best,
            "recommended": verdict.recommended,
            "pairs": pairs,
            "reasoning": list(reasoning(verdict, figs)),
        },
    }


# -- printing ----------------------------------------------------------------------------------


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}% ({part}/{whole})" if whole else "-"


def _dollars(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.6f}"  # a call may cost a thousandth of a cent


def _rounds_table(data: dict[str, Any]) -> list[str]:
    """The rounds of refinement: accuracy, flips and rates by round, and their rule."""
    lines = [
        f"rounds of refine (metric {data['metric']['name']}; {data['records']['done']} done, "
        f"{data['records']['failed']} failed)",
        f"{'t':>6}  {'right':<18}{'better':>7}{'worse':>7}{'same':>7}  "
        f"{'correction':<18}{'introduction':<18}{'pays':<6}{'calls/rec':>9}{'$/rec':>12}",
    ]
    accuracy = {a["t"]: a for a in data["accuracy"]}
    first = accuracy.get(0, {"right": 0, "n": 0})
    spent = data["generate"]
    lines.append(
        f"{0:>6}  {_share(first['right'], first['n']):<18}{'':>21}  {'':<42}"
        f"{spent['calls_per_record'] or 0:>9.2f}{_dollars(spent['cost_per_record']):>12}"
    )
    for r in data["rounds"]:
        after = accuracy.get(r["t"], {"right": 0, "n": 0})
        moved = r["vs_previous"]
        lines.append(
            f"{r['t']:>6}  {_share(after['right'], after['n']):<18}"
            f"{moved['better']:>7}{moved['worse']:>7}{moved['same']:>7}  "
            f"{_share(r['fixed'], r['n'] - r['right_before']):<18}"
            f"{_share(r['broken'], r['right_before']):<18}{'yes' if r['pays'] else 'no':<6}"
            f"{r['calls_per_record'] or 0:>9.2f}{_dollars(r['cost_per_record']):>12}"
        )
    c = data["chosen"]
    return [
        *lines,
        f"{'chosen':>6}  {_share(c['right_before'] - c['broken'] + c['fixed'], c['n']):<18}"
        f"{c['vs_first']['better']:>7}{c['vs_first']['worse']:>7}{c['vs_first']['same']:>7}  "
        f"{_share(c['fixed'], c['n'] - c['right_before']):<18}"
        f"{_share(c['broken'], c['right_before']):<18}(against the first answer)",
        "better, worse, same: records round t made right, made wrong, left (against t-1)",
        f"rounds that pay: {data['recommendation']} refinement(s)",
        *(f"  {why}" for why in data["reasoning"]),
    ]


def _arm_note(arm: dict[str, Any]) -> str:
    if "samples" in arm:
        parts = ", ".join(f"N={n} on {k}" for n, k in arm["samples"].items())
        ratio = arm.get("calls_vs_refine")
        return parts + ("" if ratio is None else f"; calls {ratio:.2f} x refine's")
    return str(arm.get("from", ""))


def _arms_table(data: dict[str, Any]) -> list[str]:
    """The arms at equal budget: accuracy with its interval, spend per record, the verdict."""
    arms, comparison = data["arms"], data["comparison"]
    n = arms[0]["measured"] if arms else 0
    lines = [
        f"arms at equal budget ({data['metric']['name']} on {n} records; 95% Wilson intervals; "
        f"each arm paired with the best by {comparison['test'].split(',')[0]})",
        f"{'arm':<11}{'right':<18}{'95% interval':<15}{'calls/rec':>10}{'tokens/rec':>12}"
        f"{'$/rec':>12}  note",
    ]
    for arm in arms:
        lo, hi = arm["interval"]
        lines.append(
            f"{arm['name']:<11}{_share(arm['right'], arm['measured']):<18}"
            f"{f'{100 * lo:.1f}-{100 * hi:.1f}%':<15}{arm['calls_per_record']:>10.2f}"
            f"{arm['tokens_per_record']:>12,.0f}{_dollars(arm['cost_per_record']):>12}  "
            f"{_arm_note(arm)}"
        )
    ratio = next((a.get("calls_vs_refine") for a in arms if "calls_vs_refine" in a), None)
    if ratio is not None and abs(ratio - 1) > 0.1:
        lines.append(
            f"note: best-of-n made {ratio:.2f} times refine's calls per record (its drafts "
            "were cut off and repaired more or less often than refine's first answers)"
        )
    lines += [f"  {why}" for why in comparison["reasoning"]]
    lines.append(f"recommendation: {comparison['recommended']}")
    return lines


def render(data: dict[str, Any], directory: Path | None = None) -> str:
    """The calibration as printed: the rounds, the arms, the recommendations, the spend."""
    sample = data.get("sample") or {}
    metric = data["metric"]
    where = "from a label" if metric["source"] == "label" else "from checks"
    lines = [
        f"calibration of {data['job']['name']} on {sample.get('records', '?')} records of "
        f"{data.get('input', '?')} (model {data['model']})",
        f"metric: {metric['name']} ({where})",
        "",
    ]
    if data.get("rounds") is not None and "chosen" in data:
        lines += [*_rounds_table(data), ""]
    if data.get("arms"):
        lines += [*_arms_table(data), ""]
    lines.append(f"spent: {_dollars(data.get('spent_usd'))} in all")
    if directory is not None:
        if data.get("arms"):
            lines.append(
                f"run the recommended arm: refine run ... --plan auto --calibration {directory}"
            )
        if data.get("recommendation") is not None:
            lines.append(
                f"or refine with the rounds that pay: refine run ... --max-iters auto "
                f"--calibration {directory}"
            )
        lines.append(f"(written to {directory / CALIBRATION})")
    return "\n".join(lines)
