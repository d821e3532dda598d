"""The journal: an append-only file of completed model calls (``checkpoint.jsonl``).

Every completed call is appended as one JSON line and made durable (written
and fsynced) before its loop moves on. Calls finishing together share one
write and one fsync (group commit), so durability costs one disk flush per
batch, not per call. A kill can only tear the last line: ``load`` cuts it off
and warns. The journal is the source of truth for resume. Steps of records that ended
``done`` are dropped when the journal is compacted; those of failed records are kept,
so ``--retry-failed`` can resume them from their last completed call.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import orjson

from ..core.steps import Step
from ..errors import StoreError

__all__ = ["Journal", "read_steps", "repair_tail"]

# Rewrite the journal without finished records once they are most of it.
COMPACT_RATIO = 0.5
COMPACT_MIN_BYTES = 1 << 20


def repair_tail(path: Path, warn: Callable[[str], None]) -> None:
    """Cut a torn (unterminated) final line off a JSONL file, warning with its name."""
    try:
        _repair_tail(path, warn)
    except OSError as err:
        raise StoreError(f"cannot repair {path}: {err.strerror}") from err


def _repair_tail(path: Path, warn: Callable[[str], None]) -> None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    with path.open("rb+") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        # Scan back for the last complete line.
        block = 1 << 16
        pos = size
        keep = 0
        while pos > 0:
            start = max(0, pos - block)
            fh.seek(start)
            chunk = fh.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    warn(f"{path}: repaired a torn final line ({size - keep} bytes cut; it is redone on resume)")


class Journal:
    """Append-only JSONL journal with group commit."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self._fh: Any = None
        self._pending: list[bytes] = []
        self._batch = anyio.Event()
        self._wake = anyio.Event()
        self._error: StoreError | None = None
        self.saved = 0

    def load(self, done: set[str], warn: Callable[[str], None]) -> dict[str, list[Step]]:
        """Repair the tail, then return the steps of every record not in ``done``."""
        repair_tail(self.path, warn)
        try:
            steps, total, kept = read_steps(self.path, done, warn)
            big = total and self.path.stat().st_size >= COMPACT_MIN_BYTES
            if big and kept < total * COMPACT_RATIO:
                self._rewrite(steps)
        except OSError as err:
            raise StoreError(f"cannot read or compact {self.path}: {err.strerror}") from err
        return steps

    def _rewrite(self, steps: dict[str, list[Step]]) -> None:
        tmp = self.path.with_suffix(".compact")
        with tmp.open("wb") as fh:
            for line in _lines((rid, i, s) for rid, ss in steps.items() for i, s in enumerate(ss)):
                fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def open(self) -> None:
        """Open for appending (after ``load``)."""
        try:
            self._fh = self.path.open("ab")
        except OSError as err:
            raise StoreError(f"cannot open checkpoint {self.path}: {err.strerror}") from err

    async def save(self, record_id: str, index: int, step: Step) -> None:
        """Append one completed call; return once it is durable."""
        if self._error is not None:
            raise self._error
        self._pending.extend(_lines([(record_id, index, step)]))
        batch = self._batch
        self._wake.set()
        await batch.wait()
        if self._error is not None:
            raise self._error

    def _write(self, data: bytes) -> None:
        self._fh.write(data)
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())

    async def _flush_once(self) -> None:
        data, batch = b"".join(self._pending), self._batch
        count = len(self._pending)
        self._pending = []
        self._batch = anyio.Event()
        try:
            await anyio.to_thread.run_sync(self._write, data)
            self.saved += count
        except OSError as err:
            self._error = StoreError(
                f"cannot write checkpoint {self.path}: {err.strerror}; "
                "what was saved before is intact and the run can be resumed"
            )
        finally:
            batch.set()

    async def run(self) -> None:
        """The flusher task: write pending entries in batches until cancelled."""
        try:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                if self._pending:
                    await self._flush_once()
                if self._error is not None:
                    return
        finally:
            with anyio.CancelScope(shield=True):
                if self._pending and self._error is None:
                    await self._flush_once()

    def close(self) -> None:
        """Close the file (after the flusher has stopped)."""
        if self._fh is not None:
            # After a failed write (disk full) closing retries the flush and fails again;
            # the journal's torn tail is cut off on the next start.
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None


def read_steps(
    path: Path, skip: set[str], warn: Callable[[str], None] | None = None
) -> tuple[dict[str, list[Step]], int, int]:
    """The journaled steps of every record not in ``skip``, with the entries read and kept.

    Read-only (``refine status`` reads a journal a live run is appending to): an
    unreadable entry, such as a line being written, is skipped.
    """
    steps: dict[str, list[Step]] = {}
    total = kept = 0
    if not path.exists():
        return steps, total, kept
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            total += 1
            try:
                entry = orjson.loads(raw)
                rid, index = entry["id"], int(entry["n"])
                if rid in skip:
                    continue
                have = steps.setdefault(rid, [])
                if index == len(have):
                    have.append(Step.from_dict(entry["step"]))
                    kept += 1
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                if warn is not None:
                    warn(f"{path}:{lineno}: unreadable checkpoint entry skipped ({err})")
    return steps, total, kept


def _lines(entries: Iterable[tuple[str, int, Step]]) -> list[bytes]:
    return [
        orjson.dumps({"id": rid, "n": index, "step": step.to_dict()}) + b"\n"
        for rid, index, step in entries
    ]
