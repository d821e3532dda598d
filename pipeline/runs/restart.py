"""A run that never had a model call succeed may be started over with a corrected command.

A wrong ``--model``, job or input is refused on an existing RUN_DIR, since the run's
finished calls were made with the old one. A run none of whose calls succeeded (the
model name was wrong, the endpoint refused every call) holds nothing worth keeping: the
corrected command takes the directory over instead, its record files removed (failed
records run again) and its manifest written afresh.
"""

from __future__ import annotations

import orjson

from ..errors import StoreError
from .journal import read_steps
from .rundir import RunDir

__all__ = ["made_no_call", "start_over"]


def made_no_call(rd: RunDir) -> bool:
    """Whether no model call of the run in ``rd`` ever succeeded (and no batch was sent)."""
    if rd.batches_path.exists() and rd.batches_path.stat().st_size:
        return False
    steps = read_steps(rd.journal_path, set())
    if any(steps.values()):
        return False
    if rd.outputs_path.exists():
        with rd.outputs_path.open("rb") as fh:
            for raw in fh:
                try:
                    calls = orjson.loads(raw)["usage"]["calls"]
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    continue
                if calls:
                    return False
    return True


def start_over(rd: RunDir) -> None:
    """Remove the run's record files (outputs, traces, bad lines, journal, progress)."""
    for path in (
        rd.outputs_path,
        rd.traces_path,
        rd.errors_path,
        rd.journal_path,
        rd.progress_path,
    ):
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            raise StoreError(f"cannot remove {path}: {err.strerror}") from err
