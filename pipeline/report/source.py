"""What a report reads: the run's manifest, and its JSONL files streamed one line at a time.

Every read of ``manifest.json`` happens in :func:`read_run_info`; the rest of the
package sees the :class:`RunInfo` it returns. Output and trace lines are read as plain
mappings and every field is checked before use: a report is also made of runs still
being written, and of runs written by older versions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import orjson

from ..client.prices import PriceBook, at_batch_rate, price_book
from ..errors import ConfigError
from ..runs.rundir import RunDir

__all__ = [
    "SCORE",
    "Key",
    "Pricing",
    "RunInfo",
    "RunReader",
    "Scan",
    "Skipped",
    "Values",
    "integer",
    "number",
    "objects",
    "read_ids",
    "read_run_info",
    "record_values",
    "scan",
]

Key = tuple[Literal["score", "metric"], str]
SCORE: Final[Key] = ("score", "score")


@dataclass(frozen=True, slots=True)
class Pricing:
    """How the report prices calls: the run's price book and the model of each role."""

    book: PriceBook
    model_for: Mapping[str, str]  # for steps and lines written before they named their model

    @classmethod
    def single(cls, model: str, book: PriceBook | None = None) -> Pricing:
        """Every role on ``model``."""
        return cls(book or PriceBook(), dict.fromkeys(("generate", "feedback", "refine"), model))

    def model_of(self, step: Mapping[str, Any]) -> str:
        """The model that answered a traced call: its own ``model``, else its role's."""
        own = step.get("model")
        if isinstance(own, str) and own:
            return own
        return self.model_for.get(str(step.get("role")), self.model_for.get("generate", ""))

    def step(self, step: Mapping[str, Any]) -> float | None:
        """One traced call's dollars; None when its model has no price."""
        price = self.book.price(self.model_of(step))
        if price is None:
            return None
        batch = at_batch_rate(step.get("batch_id"), step.get("service_tier"))
        return price.cost(_usage(step.get("usage")), batch=batch)

    def record(self, line: Mapping[str, Any]) -> float | None:
        """A record's dollars: its ``cost_usd``, or, on lines older than that field, its tokens."""
        if "cost_usd" in line:
            value = number(line.get("cost_usd"))
            return None if value is None or value[1] else value[0]
        price = self.book.price(self.model_for.get("generate"))
        return None if price is None else price.cost(_usage(line.get("usage")))


def _usage(value: Any) -> dict[str, int]:
    return {str(k): integer(v) for k, v in value.items()} if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What the report needs from the manifest."""

    run_dir: Path
    job: str
    model: str
    state: str
    input_path: str
    max_iters: int | None
    created_at: str | None
    updated_at: str | None
    records: int | None  # input records expected (None: the input file cannot be read)
    bad_lines: int  # input lines that could not become records (errors.jsonl)
    pricing: Pricing
    job_source: str = ""  # where the run loaded its job from (a built-in's path, or a file)
    job_hash: str = ""  # the job's content hash when the run started


def read_run_info(run_dir: Path) -> RunInfo:
    """The manifest's job, models, state, input and timestamps (ConfigError when there is none)."""
    rd = RunDir(Path(run_dir))
    manifest = rd.require_manifest()
    expected = rd.expected(manifest)
    model, critic = manifest.model, manifest.critic
    return RunInfo(
        run_dir=rd.path,
        job=manifest.job.name,
        model=model if critic == model else f"{model} (critic: {critic})",
        state=manifest.state,
        input_path=manifest.input.path,
        max_iters=manifest.settings.max_iters,
        created_at=manifest.created_at,
        updated_at=manifest.updated_at,
        records=expected.records,
        bad_lines=expected.bad_lines,
        pricing=Pricing(
            price_book(manifest.settings.prices, missing_ok=True),
            {"generate": model, "refine": model, "feedback": critic},
        ),
        job_source=manifest.job.source,
        job_hash=manifest.job.hash,
    )


@dataclass(slots=True)
class Skipped:
    """Lines that could not be read (a torn tail, or a line being written right now)."""

    lines: int = 0


def objects(path: Path, skipped: Skipped) -> Iterator[dict[str, Any]]:
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
                skipped.lines += 1
                continue
            if isinstance(obj, dict):
                yield obj
            else:
                skipped.lines += 1


class RunReader(Protocol):
    """Fed every finished record of a run: all outputs lines first, then all trace lines."""

    def output(self, line: Mapping[str, Any]) -> None: ...

    def trace(self, line: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class Scan:
    """What one pass over a run directory found besides what its readers kept."""

    info: RunInfo
    skipped_lines: int


def scan(info: RunInfo, readers: Sequence[RunReader]) -> Scan:
    """Read the run's files once, in order, handing every line to every reader."""
    skipped = Skipped()
    for line in objects(info.run_dir / "outputs.jsonl", skipped):
        for reader in readers:
            reader.output(line)
    for line in objects(info.run_dir / "traces.jsonl", skipped):
        for reader in readers:
            reader.trace(line)
    return Scan(info, skipped.lines)


def read_ids(path: Path) -> list[str]:
    """Record ids listed in a text file, one per line (blank lines skipped)."""
    ids: list[str] = []
    try:
        with Path(path).open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                try:
                    text = raw.decode("utf-8").strip()
                except UnicodeDecodeError as err:
                    raise ConfigError(f"{path}:{lineno}: record id is not UTF-8 text") from err
                if text:
                    ids.append(text)
    except OSError as err:
        raise ConfigError(f"cannot read the record ids in {path}: {err.strerror}") from err
    if not ids:
        raise ConfigError(f"{path} names no record id (one id per line)")
    return ids


# -- fields of one line ------------------------------------------------------------------------


def number(value: Any) -> tuple[float, bool] | None:
    """A finite number and whether it was a boolean; None for anything else."""
    if isinstance(value, bool):
        return (1.0 if value else 0.0), True
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value), False
    return None


def integer(value: Any, default: int = 0) -> int:
    """``value`` when it is an int (not a bool), else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(frozen=True, slots=True)
class Values:
    """The measures of one outputs line, by iteration (0 .. size-1)."""

    size: int  # answers: iterations 0..size-1
    made: int  # refinements made
    chosen: int | None
    series: dict[Key, list[float | None]]  # the score first, then metrics in first-seen order
    numeric: dict[Key, bool]  # whether any value of the measure was a number, not a boolean


def record_values(line: Mapping[str, Any]) -> Values:
    """The critic's score and every numeric or boolean evaluator metric of each iteration."""
    scores = line.get("scores")
    scores = scores if isinstance(scores, list) else []
    by_iteration = line.get("metrics_by_iteration")
    by_iteration = by_iteration if isinstance(by_iteration, list) else []
    made = integer(line.get("iterations"))
    chosen = line.get("chosen_iteration")
    chosen = chosen if isinstance(chosen, int) and not isinstance(chosen, bool) else None
    # Answers are iterations 0..last, one per generate/refine step; scores and metrics
    # are indexed the same way (the last answer may have no score: no feedback on it).
    size = max(made, len(scores) - 1, len(by_iteration) - 1, chosen or 0) + 1
    series: dict[Key, list[float | None]] = {SCORE: [None] * size}
    numeric: dict[Key, bool] = {SCORE: True}
    for t, score in enumerate(scores):
        num = number(score)
        if num is not None:
            series[SCORE][t] = num[0]
    for t, metrics in enumerate(by_iteration):
        if not isinstance(metrics, dict):
            continue
        for name, raw in metrics.items():
            num = number(raw)
            if num is None:
                continue  # text (an evaluator error, an extracted answer) is not a measure
            key: Key = ("metric", str(name))
            series.setdefault(key, [None] * size)[t] = num[0]
            numeric[key] = numeric.get(key, False) or not num[1]
    return Values(size, made, chosen, series, numeric)
