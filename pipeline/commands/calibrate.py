"""``refine calibrate``: does refinement pay, for this model and this task? Measured, not assumed.

A labelled sample of the input (``SAMPLE_SIZE`` records by default, taken evenly: the
record at every k-th position) runs with the settings a ``refine run`` would use, into a
run directory of its own, so the budget, the checkpoints and resume behave as in a run.
From its outputs come, for one right-or-wrong metric (by default the first the job
declares as read from a label, such as gsm's ``correct``): the accuracy at each
iteration, each round's flips and its correction and introduction rates, and the rule of
:mod:`pipeline.report.payoff`. The recommendation, the number of leading rounds that pay,
is written to ``calibration.json`` in that directory, where ``refine run --max-iters auto
--calibration DIR`` reads it. Labels measure here; they never choose: the sample runs
exactly as any run does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import anyio
import orjson

from ..core.jobs import Job
from ..core.loader import load_job
from ..errors import ConfigError, StoreError
from ..io.records import read_records
from ..report.aggregate import RunReport, summarize
from ..report.flips import Change, MetricFlips
from ..report.payoff import Rates, reasoning, recommend
from ..runner import RunSummary, arun
from ..runs.settings import Settings, effective_job

__all__ = [
    "CALIBRATION",
    "SAMPLE_FILE",
    "SAMPLE_SIZE",
    "Calibrated",
    "Calibration",
    "acalibrate",
    "calibrate",
    "even_positions",
    "measure",
    "read_calibration",
    "recommended_iters",
    "render",
]

SAMPLE_SIZE: Final = 50
CALIBRATION: Final = "calibration.json"
SAMPLE_FILE: Final = "sample.jsonl"
VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Calibration:
    """What ``calibration.json`` holds (``data``), with the fields a later run checks."""

    job: str
    job_hash: str
    model: str
    recommendation: int
    data: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> Calibration:
        """Read a ``calibration.json`` object; ConfigError when it is not one."""
        try:
            job = data["job"]
            recommendation = data["recommendation"]
            if not isinstance(recommendation, int) or recommendation < 0:
                raise ValueError(f"recommendation {recommendation!r}")
            return cls(str(job["name"]), str(job["hash"]), str(data["model"]), recommendation, data)
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"{where}: not a calibration of refine ({err!r})") from err


@dataclass(frozen=True, slots=True)
class Calibrated:
    """A calibration run: the run's summary, and the calibration once the sample finished."""

    summary: RunSummary
    calibration: Calibration | None  # None: the run stopped early (resume it to finish)

    @property
    def exit_code(self) -> int:
        """The run's exit status (0: every sampled record done)."""
        return self.summary.exit_code


# -- the sample --------------------------------------------------------------------------------


def even_positions(total: int, size: int) -> list[int]:
    """``size`` positions spread evenly over ``total`` (all of them when there are fewer)."""
    if total <= size:
        return list(range(total))
    return [i * total // size for i in range(size)]


def _sample_lines(job: Job, input_path: Path, settings: Settings, size: int) -> bytes:
    """The sampled records as JSONL: readable records only, of the first ``--limit`` lines."""

    def readable() -> Iterator[dict[str, Any]]:
        for item in read_records(input_path, job.inputs, settings.id_field):
            if settings.limit is not None and item.line > settings.limit:
                return
            if not isinstance(item, Exception):
                yield item.fields

    total = sum(1 for _ in readable())
    wanted = set(even_positions(total, size))
    return b"".join(orjson.dumps(f) + b"\n" for i, f in enumerate(readable()) if i in wanted)


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


# -- the measures ------------------------------------------------------------------------------


def _pick(report: RunReport, job: Job, metric: str | None) -> MetricFlips:
    """The metric to judge by: ``metric``, else the first boolean from a label, else the first
    boolean."""
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
    """The calibration of a finished sample run, as ``calibration.json`` holds it."""
    report = summarize(run_dir)
    m = _pick(report, job, metric)
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
        "recommendation": recommend(rounds),
        "reasoning": list(reasoning(rounds)),
    }


# -- the command -------------------------------------------------------------------------------


async def acalibrate(
    job: Job | str,
    input_path: str | Path,
    out: str | Path,
    settings: Settings | None = None,
    *,
    sample: int = SAMPLE_SIZE,
    metric: str | None = None,
    **run_kwargs: Any,
) -> Calibrated:
    """Run ``sample`` records taken evenly from ``input_path`` into ``out`` and calibrate.

    ``settings`` are those of the run to come (``--limit`` bounds the lines sampled from);
    ``run_kwargs`` go to ``arun`` (a client, progress, signal handlers).
    """
    settings = settings or Settings()
    if settings.shard is not None:
        raise ConfigError("refine calibrate takes its own sample: --shard does not apply")
    if sample < 1:
        raise ConfigError("--sample must be >= 1")
    job = effective_job(load_job(job) if isinstance(job, str) else job, settings)
    input_path, out = Path(input_path), Path(out)
    if not input_path.is_file():
        raise ConfigError(f"input file not found: {input_path}")
    lines = _sample_lines(job, input_path, settings, sample)
    path = _write_sample(out, lines)
    summary = await arun(job, path, out, replace(settings, limit=None), **run_kwargs)
    if summary.exit_code not in (0, 1):
        return Calibrated(summary, None)
    data = measure(out, job, metric=metric)
    data["input"] = str(input_path.resolve())
    data["sample"] = {"records": lines.count(b"\n"), "requested": sample}
    _atomic_write(out / CALIBRATION, orjson.dumps(data, option=orjson.OPT_INDENT_2))
    return Calibrated(summary, Calibration.from_json(data, str(out / CALIBRATION)))


def calibrate(
    job: Job | str,
    input_path: str | Path,
    out: str | Path,
    settings: Settings | None = None,
    **kwargs: Any,
) -> Calibrated:
    """Calibrate (see ``acalibrate``), from synchronous code."""
    return anyio.run(lambda: acalibrate(job, input_path, out, settings, **kwargs))


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


def recommended_iters(directory: str | Path, job: Job | str, model: str | None = None) -> int:
    """The refinements ``refine calibrate`` recommended for ``job`` (and ``model``, when given).

    ConfigError when the calibration is of another job, of another version of its files,
    or of another model: its rates say nothing about those.
    """
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
    return cal.recommendation


# -- printing ----------------------------------------------------------------------------------


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}% ({part}/{whole})" if whole else "-"


def _dollars(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.6f}"  # a call may cost a thousandth of a cent


def render(data: dict[str, Any], directory: Path | None = None) -> str:
    """The calibration as printed: accuracy, flips and rates by round, cost, recommendation."""
    metric = data["metric"]
    sample = data.get("sample") or {}
    where = "from a label" if metric["source"] == "label" else "from checks"
    lines = [
        f"calibration of {data['job']['name']} on {sample.get('records', '?')} records of "
        f"{data['input']} (model {data['model']})",
        f"metric: {metric['name']} ({where}); {data['records']['done']} done, "
        f"{data['records']['failed']} failed",
        "",
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
    lines += [
        f"{'chosen':>6}  {_share(c['right_before'] - c['broken'] + c['fixed'], c['n']):<18}"
        f"{c['vs_first']['better']:>7}{c['vs_first']['worse']:>7}{c['vs_first']['same']:>7}  "
        f"{_share(c['fixed'], c['n'] - c['right_before']):<18}"
        f"{_share(c['broken'], c['right_before']):<18}(against the first answer)",
        "better, worse, same: records round t made right, made wrong, left (against t-1)",
        "",
        f"calls per record: {data['calls_per_record'] or 0:.2f}; cost per record: "
        f"{_dollars(data['cost_per_record'])}",
        f"recommendation: {data['recommendation']} refinement(s)",
        *(f"  {why}" for why in data["reasoning"]),
    ]
    if directory is not None:
        lines.append(
            f"use it: refine run ... --max-iters auto --calibration {directory} "
            f"(written to {directory / CALIBRATION})"
        )
    return "\n".join(lines)
