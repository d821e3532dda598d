"""Reading a record's calls back, each with its request rebuilt exactly as it was sent.

traces.jsonl holds one line per finished record, ``{"id", "steps"}``; the journal holds the
steps of records not finished yet. Both store each step in ``core.trace``'s form (the
messages it added to its record's conversation, and the earlier call it extends), and
older runs' steps whole; this is where the package reads either back: ``refine show``,
``--retry-failed`` (a failed record resumes from its traced calls) and anything else that
needs a call's messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..core.steps import Step
from ..core.trace import steps_of
from ..errors import RunDirError, StoreError
from .journal import line_id, read_record
from .rundir import RunDir

__all__ = ["AFTER_ID", "RecordTrace", "find_trace", "read_traces", "resumable", "trace_steps"]

AFTER_ID = b',"steps":'  # what follows the id in a line of traces.jsonl


@dataclass(frozen=True, slots=True)
class RecordTrace:
    """One record's calls, in order, each with its messages as sent."""

    record_id: str
    steps: tuple[Step, ...]
    finished: bool  # from traces.jsonl; False: from the journal (the record is not finished)
    chosen: int | None = None  # the index of the step whose answer is the record's output


def trace_steps(line: Mapping[str, Any], where: str) -> list[Step]:
    """The steps of one traces.jsonl line, rebuilt; RunDirError names ``where`` and the step."""
    steps = line.get("steps")
    if not isinstance(steps, list):
        raise RunDirError(f"{where}: no list of steps")
    try:
        return steps_of(steps)
    except ValueError as err:
        raise RunDirError(f"{where}: {err}") from err


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    except OSError as err:
        raise StoreError(f"cannot read {path}: {err.strerror}") from err
    with fh:
        yield from enumerate(fh, start=1)


def _matching(path: Path, wanted: Callable[[str], bool]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, parsed line) of each line of traces.jsonl whose id is wanted."""
    for lineno, raw in _lines(path):
        rid = line_id(raw, AFTER_ID)
        if rid is not None and not wanted(rid):
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue  # a torn last line, or one being written
        if isinstance(obj, dict) and wanted(str(obj.get("id"))):
            yield lineno, obj


def read_traces(path: Path, ids: set[str], warn: Callable[[str], None]) -> dict[str, list[Step]]:
    """The traced steps of the records ``ids`` (a trace that cannot be read is warned of and
    left out)."""
    found: dict[str, list[Step]] = {}
    for lineno, obj in _matching(path, lambda rid: rid in ids):
        rid = str(obj["id"])
        try:
            found.setdefault(rid, trace_steps(obj, f"{path}:{lineno}"))
        except RunDirError as err:
            warn(f"{err}; record {rid} is run again from its start")
    return found


def resumable(steps: list[Step]) -> list[Step]:
    """A failed record's steps less the call that failed for good: what it resumes from."""
    return steps[:-1] if steps and steps[-1].failed else steps


def find_trace(rd: RunDir, record_id: str) -> RecordTrace | None:
    """A record's calls: from traces.jsonl once it finished, else from the journal; None
    when the run holds no call of it."""
    path = rd.traces_path
    for lineno, obj in _matching(path, lambda rid: rid == record_id):
        steps = trace_steps(obj, f"{path}:{lineno}")
        marks = obj["steps"]
        chosen = next((i for i, s in enumerate(marks) if s.get("chosen")), None)
        return RecordTrace(record_id, tuple(steps), True, chosen)
    journaled = read_record(rd.journal_path, record_id)
    return RecordTrace(record_id, tuple(journaled), False) if journaled else None
