"""Records whose prompt cannot fit the context window of the run's models.

``refine estimate`` reads every record of the input (the first ``--limit`` lines) and
builds its generate prompt, the first call of its loop: a record whose prompt alone
cannot fit (``client.context``'s lower bound) fails without a call when the run reaches
it. Later calls carry the whole conversation and grow with every round; one that
outgrows the window fails its record then (unsent where the bound shows it, else refused
by the server at once), with the earlier answers kept.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from ..client.context import context_window, overflow
from ..client.models import ModelId
from ..core.jobs import Job
from ..core.prompts import build_messages
from ..core.records import Record
from ..core.steps import CallKind
from ..io.records import read_records
from ..runs.settings import Settings
from ..serving.server import SLOT_CTX

__all__ = ["SHOWN", "Unfit", "find_unfit", "window_of"]

SHOWN = 10  # records named in the warning


@dataclass(frozen=True, slots=True)
class Unfit:
    """The records whose first prompt cannot fit ``model``'s window of ``window`` tokens."""

    model: str
    window: int
    count: int
    first: tuple[tuple[int, str], ...]  # (input line, id) of the first SHOWN of them

    def describe(self, records: int) -> str:
        """The warning, for people."""
        shown = ", ".join(f"line {line} (id {rid})" for line, rid in self.first)
        more = f" and {self.count - len(self.first)} more" if self.count > len(self.first) else ""
        return (
            f"warning: {self.count} of {records} records cannot fit the {self.window:,}-token "
            f"context window of {self.model} (their first prompt alone is longer): {shown}"
            f"{more}; a run fails them without a call (--context-tokens sets the window)"
        )


def window_of(model: str, settings: Settings) -> int | None:
    """The context window of ``model`` as a run would take it (None: unknown)."""
    if settings.context_tokens is not None:
        return settings.context_tokens
    if ModelId.parse(model).is_local:
        return SLOT_CTX
    return context_window(model)


def find_unfit(
    job: Job, input_path: Path, settings: Settings, model_for: Mapping[str, str]
) -> Unfit | None:
    """The records of the input whose generate prompt cannot fit, or None when all may."""
    sides = [model_for["generate"]]
    max_iters = job.max_iters if settings.max_iters is None else settings.max_iters
    if max_iters > 0 or job.scored:
        sides.append(model_for["feedback"])  # the critic's first call carries that prompt
    windows = [(w, m) for m in sides if (w := window_of(m, settings)) is not None]
    if not windows:
        return None
    window, model = min(windows)
    count = 0
    first: list[tuple[int, str]] = []
    for record in _records(job, input_path, settings):
        messages = build_messages(job, record, "generate", CallKind.ANSWER, 0, [], None)
        if overflow(messages, window, model) is None:
            continue
        count += 1
        if len(first) < SHOWN:
            first.append((record.line, record.id))
    return Unfit(model, window, count, tuple(first)) if count else None


def _records(job: Job, path: Path, settings: Settings) -> Iterator[Record]:
    """The input's records, of its first ``--limit`` lines."""
    items = read_records(path, job.inputs, settings.id_field)
    for item in islice(items, settings.limit):
        if isinstance(item, Record):
            yield item
