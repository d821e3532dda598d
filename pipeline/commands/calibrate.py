"""``refine calibrate``: refine, sample, or stop? Measured on a labelled sample, not assumed.

A labelled sample of the input (``SAMPLE_SIZE`` records by default, taken evenly: the
record at every k-th position) is written to ``DIR/sample.jsonl`` and run as each arm of
:mod:`.arms`, each into a run directory of its own under ``DIR``, so the budget, the
checkpoints and resume behave as in a run: Self-Refine with the options given, then
best-of-n sized to the calls per record Self-Refine measured, and the first answer
(Self-Refine's iteration 0). :mod:`.calibration` turns what they hold into
``calibration.json``: the rounds of refinement (flips, correction and introduction rates,
the leading rounds that pay) and the arms compared at equal budget (accuracy with its
interval, calls, tokens and dollars per record, paired tests, the arm to run). Labels
measure here; they never choose: every arm runs exactly as any run does.

Whatever can be known before a call is refused before one: a job with no right-or-wrong
metric, an unknown ``--metric``, a sample that lacks the label its metric reads. The cost
is estimated from the prompts (``refine estimate``) and reported before anything is spent;
``--budget`` caps all the arms together.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import anyio
import orjson

from ..core.jobs import Job
from ..core.loader import load_job
from ..core.metrics import MetricSpec
from ..core.strategies import MAX_SAMPLES
from ..errors import ConfigError, StoreError
from ..io.records import read_records
from ..report.aggregate import summarize
from ..report.source import read_run_info
from ..runner import RunSummary, arun
from ..runs.settings import Settings, effective_job
from .arms import (
    Arm,
    Part,
    Spent,
    even_positions,
    read_first_answers,
    read_outputs,
    size_best_of_n,
)
from .calibration import (
    CALIBRATION,
    VERSION,
    Calibration,
    Plan,
    measure,
    measure_arms,
    pick_metric,
    read_calibration,
    recommended_iters,
)
from .estimate import Estimate, run_estimate
from .status import collect

__all__ = [
    "CALIBRATION",
    "SAMPLE_FILE",
    "SAMPLE_SIZE",
    "Calibrated",
    "Calibration",
    "acalibrate",
    "calibrate",
    "declared_metric",
    "even_positions",
    "measure",
    "read_calibration",
    "recommended_iters",
]

SAMPLE_SIZE: Final = 50
SAMPLE_FILE: Final = "sample.jsonl"
BEST_OF_N_DIR: Final = "best-of-n"


@dataclass(frozen=True, slots=True)
class Calibrated:
    """A calibration: the last arm run's summary, and the calibration once every arm finished."""

    summary: RunSummary | None  # None: stopped before an arm ran (its budget was spent)
    calibration: Calibration | None  # None: stopped early (the same command continues it)
    exit_code: int
    message: str | None = None


# -- before anything is spent ------------------------------------------------------------------


def declared_metric(job: Job, metric: str | None) -> tuple[str, MetricSpec] | None:
    """The right-or-wrong metric to judge by, from what the job declares; ConfigError when
    there is none or ``metric`` is not one. None: the job leaves it to be measured."""
    if job.evaluator is None:
        raise ConfigError(
            f"job {job.name!r} has no evaluator, so nothing says whether an answer is right: "
            "calibrate a job whose hooks define evaluate() and a right-or-wrong metric "
            "(docs/jobs.md), such as gsm or acronym"
        )
    specs = job.metrics
    usable = [n for n, s in specs.items() if s.right_or_wrong is not False]
    listed = ", ".join(n for n, s in specs.items() if s.right_or_wrong) or "none"
    if metric is not None:
        if specs and metric not in specs:
            raise ConfigError(
                f"--metric {metric}: job {job.name!r} declares no such metric (its right-or-"
                f"wrong metrics: {listed})"
            )
        spec = specs.get(metric)
        if spec is not None and spec.right_or_wrong is False:
            what = (
                spec.value_type if spec.better else f"{spec.value_type} without a better direction"
            )
            raise ConfigError(
                f"--metric {metric}: job {job.name!r} declares it a {what}, not right or "
                f"wrong; its right-or-wrong metrics: {listed}"
            )
        return None if spec is None or spec.right_or_wrong is None else (metric, spec)
    if specs and not usable:
        raise ConfigError(
            f"job {job.name!r} has no right-or-wrong metric to calibrate by (its metrics: "
            f"{', '.join(specs)}): declare one in its hooks' METRICS (docs/calibrate.md)"
        )
    known = [(n, s) for n, s in specs.items() if s.right_or_wrong]
    if any(s.right_or_wrong is None for s in specs.values()) or not known:
        return None  # some type is undeclared: the first measured one decides, as before
    return next(((n, s) for n, s in known if s.source == "label"), known[0])


def _check_labels(
    job: Job, chosen: tuple[str, MetricSpec], records: list[dict[str, Any]], where: Path
) -> None:
    """A metric read from a label needs sampled records that carry one."""
    name, spec = chosen
    labels = [f.name for f in job.inputs if f.use == "label"]
    if spec.source != "label" or not labels:
        return
    if any(any(r.get(f) is not None for f in labels) for r in records):
        return
    checks = [n for n, s in job.metrics.items() if s.source == "check" and s.right_or_wrong]
    way = (
        f", or calibrate by a metric from the checks (--metric {checks[0]})"
        if checks
        else f" ({job.name} has no right-or-wrong metric that needs no label)"
    )
    raise ConfigError(
        f"{where}: none of the {len(records)} sampled records carries "
        f"{' or '.join(labels)}, the label {name} is measured by: add it to the records{way}"
    )


def _estimates(job: Job, sample: Path, base: Settings, arms: tuple[Arm, ...]) -> list[Any]:
    """Each arm's estimate from the prompts, as ``refine estimate`` makes it."""
    out: list[tuple[str, Estimate | None]] = []
    refine = run_estimate(job, sample, base)[0] if Arm.REFINE in arms else None
    if refine is not None:
        out.append((str(Arm.REFINE), refine))
    if refine is not None and Arm.BEST_OF_N in arms:
        per_record = refine.scenarios["expected"].calls / max(1, refine.records)
        n = max(1, min(MAX_SAMPLES, round(per_record)))
        sized = _best_of(base, n)
        out.append((f"best-of-n (N about {n})", run_estimate(job, sample, sized)[0]))
    if Arm.FIRST in arms:
        first = None if refine is not None else run_estimate(job, sample, _first(base))[0]
        out.append((str(Arm.FIRST), first))
    return out


def _money(value: float | None) -> str:
    return "price unknown" if value is None else f"${value:,.4f}"


def estimate_text(rows: list[Any], budget: float | None) -> str:
    """The estimate as printed before the first call."""
    lines = ["estimated cost before anything is spent (from the prompts, as `refine estimate`):"]
    expected: float | None = 0.0
    high: float | None = 0.0
    for name, est in rows:
        if est is None:
            lines.append(f"  {name:<24}refine's first answers: no call of its own")
            continue
        e, h = est.scenarios["expected"], est.scenarios["high"]
        lines.append(
            f"  {name:<24}{e.calls:>8,} calls  {_money(e.cost_usd):>14}   "
            f"(at most {h.calls:,} calls, {_money(h.cost_usd)})"
        )
        expected = None if expected is None or e.cost_usd is None else expected + e.cost_usd
        high = None if high is None or h.cost_usd is None else high + h.cost_usd
    cap = "" if budget is None else f"; --budget ${budget:g} caps every arm together"
    lines.append(f"  {'in all':<24}{_money(expected)} expected, {_money(high)} at most{cap}")
    return "\n".join(lines)


# -- the sample --------------------------------------------------------------------------------


def _sample_records(
    job: Job, input_path: Path, settings: Settings, size: int
) -> list[dict[str, Any]]:
    """The sampled records' fields: readable records only, of the first ``--limit`` lines."""

    def readable() -> Iterator[dict[str, Any]]:
        for item in read_records(input_path, job.inputs, settings.id_field):
            if settings.limit is not None and item.line > settings.limit:
                return
            if not isinstance(item, Exception):
                yield item.fields

    total = sum(1 for _ in readable())
    wanted = set(even_positions(total, size))
    return [f for i, f in enumerate(readable()) if i in wanted]


def _write_sample(out: Path, data: bytes) -> Path:
    """Write the sample once; a second calibration into ``out`` must have drawn the same."""
    path = out / SAMPLE_FILE
    if path.exists():
        if path.read_bytes() != data:
            raise ConfigError(
                f"{out} holds a calibration of another sample (another input, --sample or "
                "--limit): use another --out"
            )
        return path
    _atomic_write(path, data)
    return path


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as err:
        raise StoreError(f"cannot write {path}: {err.strerror}") from err
    finally:
        tmp.unlink(missing_ok=True)


# -- the arms ----------------------------------------------------------------------------------


def _first(base: Settings) -> Settings:
    return replace(base, max_iters=0)


def _best_of(base: Settings, n: int) -> Settings:
    return replace(base, max_iters=0, strategy=(*base.strategy, f"samples={n}"))


@dataclass(frozen=True, slots=True)
class _Arms:
    """Runs the arms' run directories under ``out``, all within one ``--budget``."""

    job: Job
    out: Path
    budget: float | None
    run_kwargs: Mapping[str, Any]
    summaries: list[RunSummary]  # of the arms run so far, in order

    def run_dirs(self) -> list[Path]:
        """Every arm run directory under ``out`` (those of earlier invocations too)."""
        found = [self.out / str(Arm.REFINE), self.out / str(Arm.FIRST)]
        found += sorted((self.out / BEST_OF_N_DIR).glob("samples-*"))
        return [d for d in found if (d / "manifest.json").is_file()]

    def spent(self, but: Path | None = None) -> float:
        """Dollars the arms' run directories hold (all of them but ``but``)."""
        return sum(collect(d)["cost_usd"] or 0.0 for d in self.run_dirs() if d != but)

    async def run(self, sample: Path, run_dir: Path, settings: Settings) -> Calibrated | None:
        """Run one arm; a Calibrated that stops the calibration, or None when it finished."""
        if self.budget is not None:
            left = self.budget - self.spent(but=run_dir)
            if left <= 0:
                message = (
                    f"--budget ${self.budget:g} is spent by the arms run so far: continue "
                    "with the same command and a larger --budget"
                )
                return Calibrated(None, None, 6, message)
            settings = replace(settings, budget=left)
        summary = await arun(self.job, sample, run_dir, settings, **self.run_kwargs)
        if summary.exit_code not in (0, 1):
            return Calibrated(summary, None, summary.exit_code, summary.message)
        self.summaries.append(summary)
        return None


def _part_input(out: Path, sample: Path, lines: list[bytes], part: Part, whole: bool) -> Path:
    """The records of one best-of-n part: the sample itself, or the part's own file."""
    if whole:
        return sample
    path = out / BEST_OF_N_DIR / f"samples-{part.samples}.jsonl"
    data = b"".join(lines[p] for p in part.positions)
    if not path.exists() or path.read_bytes() != data:
        _atomic_write(path, data)
    return path


async def acalibrate(
    job: Job | str,
    input_path: str | Path,
    out: str | Path,
    settings: Settings | None = None,
    *,
    sample: int = SAMPLE_SIZE,
    metric: str | None = None,
    arms: tuple[Arm, ...] = tuple(Arm),
    announce: Callable[[str], None] | None = None,
    **run_kwargs: Any,
) -> Calibrated:
    """Run the ``arms`` on ``sample`` records taken evenly from ``input_path`` and calibrate.

    ``settings`` are those of the run to come (``--limit`` bounds the lines sampled from);
    ``announce`` gets the cost estimate before the first call; ``run_kwargs`` go to ``arun``
    (a client, progress, signal handlers).
    """
    settings = settings or Settings()
    if settings.shard is not None:
        raise ConfigError("refine calibrate takes its own sample: --shard does not apply")
    if sample < 1:
        raise ConfigError("--sample must be >= 1")
    if not arms:
        raise ConfigError("--arms: no arm to run")
    if Arm.BEST_OF_N in arms and Arm.REFINE not in arms:
        raise ConfigError(
            "--arms: best-of-n is sized by the calls the refine arm makes: add refine"
        )
    job = effective_job(load_job(job) if isinstance(job, str) else job, settings)
    input_path, out = Path(input_path), Path(out)
    if not input_path.is_file():
        raise ConfigError(f"input file not found: {input_path}")
    if (out / "manifest.json").is_file():
        raise ConfigError(
            f"{out} holds a calibration made before calibrate compared arms (its run is {out} "
            "itself): calibrate into a new --out (`refine report` still reads the old one)"
        )
    declared = declared_metric(job, metric)
    records = _sample_records(job, input_path, settings, sample)
    if not records:
        raise ConfigError(f"{input_path}: no readable record to sample")
    if declared is not None:
        _check_labels(job, declared, records, input_path)
    lines = [orjson.dumps(f) + b"\n" for f in records]
    path = _write_sample(out, b"".join(lines))
    base = replace(settings, limit=None, budget=None)
    if announce is not None:
        announce(estimate_text(_estimates(job, path, base, arms), settings.budget))
    runner = _Arms(job, out, settings.budget, run_kwargs, [])
    primary = out / str(Arm.REFINE if Arm.REFINE in arms else Arm.FIRST)
    stopped = await runner.run(path, primary, base if Arm.REFINE in arms else _first(base))
    if stopped is not None:
        return stopped
    name = (
        declared[0] if declared is not None else pick_metric(summarize(primary), job, metric).name
    )
    spent: dict[Arm, Spent] = {}
    plans: dict[Arm, Plan] = {}
    dirs: dict[Arm, list[str]] = {}
    samples: dict[int, int] = {}
    max_iters = job.max_iters if base.max_iters is None else base.max_iters
    if Arm.REFINE in arms:
        spent[Arm.REFINE] = read_outputs([primary], name)
        plans[Arm.REFINE] = Plan.of(str(Arm.REFINE), max_iters, base.strategy, base)
        dirs[Arm.REFINE] = [str(Arm.REFINE)]
    first = read_first_answers(primary, name) if Arm.REFINE in arms else None
    if Arm.BEST_OF_N in arms:
        assert first is not None  # parse_arms: best-of-n goes with refine
        a = spent[Arm.REFINE]
        per_draft = first.calls / first.drafts if first.drafts else 1.0
        parts = size_best_of_n(a.calls / max(1, a.records), per_draft, len(lines))
        part_dirs = []
        for part in parts:
            part_dir = out / BEST_OF_N_DIR / f"samples-{part.samples}"
            part_path = _part_input(out, path, lines, part, len(parts) == 1)
            stopped = await runner.run(part_path, part_dir, _best_of(base, part.samples))
            if stopped is not None:
                return stopped
            part_dirs.append(part_dir)
            samples[part.samples] = len(part.positions)
        spent[Arm.BEST_OF_N] = read_outputs(part_dirs, name)
        most = max(parts, key=lambda p: (len(p.positions), p.samples)).samples
        plans[Arm.BEST_OF_N] = Plan.of(str(Arm.BEST_OF_N), 0, _best_of(base, most).strategy, base)
        dirs[Arm.BEST_OF_N] = [str(d.relative_to(out)) for d in part_dirs]
    if Arm.FIRST in arms:
        spent[Arm.FIRST] = first if first is not None else read_outputs([primary], name)
        plans[Arm.FIRST] = Plan.of(str(Arm.FIRST), 0, base.strategy, base)
        dirs[Arm.FIRST] = [primary.name]
    data = _assemble(job, primary, name, declared, Arm.REFINE in arms)
    data.update(measure_arms(spent, plans, dirs, samples))
    data["input"] = str(input_path.resolve())
    data["sample"] = {"records": len(lines), "requested": sample}
    costs = [collect(d)["cost_usd"] for d in runner.run_dirs()]
    data["spent_usd"] = None if None in costs else sum(c or 0.0 for c in costs)
    _atomic_write(out / CALIBRATION, orjson.dumps(data, option=orjson.OPT_INDENT_2))
    calibration = Calibration.from_json(data, str(out / CALIBRATION))
    code = max(s.exit_code for s in runner.summaries)
    return Calibrated(runner.summaries[-1], calibration, code)


def _assemble(
    job: Job,
    primary: Path,
    name: str,
    declared: tuple[str, MetricSpec] | None,
    rounds: bool,
) -> dict[str, Any]:
    """The rounds of the refine arm, or (without it) the fields every calibration has."""
    if rounds:
        return measure(primary, job, metric=name)
    info = read_run_info(primary)
    source = declared[1].source if declared is not None else None
    if source is None:
        source = pick_metric(summarize(primary), job, name).source
    return {
        "version": VERSION,
        "job": {"name": job.name, "hash": job.content_hash},
        "model": info.model,
        "max_iters": info.max_iters,
        "metric": {"name": name, "source": source},
        "recommendation": None,
    }


def calibrate(
    job: Job | str,
    input_path: str | Path,
    out: str | Path,
    settings: Settings | None = None,
    **kwargs: Any,
) -> Calibrated:
    """Calibrate (see ``acalibrate``), from synchronous code."""
    return anyio.run(lambda: acalibrate(job, input_path, out, settings, **kwargs))
