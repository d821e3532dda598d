"""The journal: an append-only file of completed model calls (``checkpoint.jsonl``).

Every completed call is appended as one JSON line, ``{"id", "n", "step"}`` (the record, the
step's index, the step in ``core.trace``'s stored form: the messages it added to its
record's conversation), and made durable (written and fsynced) before its loop moves on.
Calls finishing together share one write and one fsync (group commit), so durability costs
one disk flush per batch, not per call. A kill can only tear the last line: ``load`` cuts it
off and warns. The journal is the source of truth for resume.

A record's entries are needed only until its lines in outputs.jsonl and traces.jsonl are
durable. Then they go: whenever the entries of finished records outweigh the rest (and a
mebibyte) the flusher makes the finished records' lines durable and rewrites the journal
without them, and a run's end does the same for whatever finished, so a finished run leaves
an empty journal and one copy of everything. A rewrite goes to a new file that replaces the
journal in one rename: a kill at any moment leaves the old journal or the new one, each
with every step of every record not yet durably finished.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson

from ..core.steps import Step
from ..core.trace import step_of, stored_step
from ..errors import StoreError

__all__ = [
    "COMPACT_MIN_BYTES",
    "Journal",
    "line_id",
    "read_record",
    "read_steps",
    "repair_tail",
]

log = logging.getLogger("refine")

# Finished records' entries are dropped once they weigh this much and more than the rest.
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


def line_id(raw: bytes, after: bytes) -> str | None:
    """The ``id`` of a JSONL line this package wrote (``{"id": ..., <after>...``), read
    without parsing the rest; None when the line is not of that shape."""
    # A JSON string escapes its quotes, so `after` cannot occur inside the id.
    end = raw.find(after)
    if not raw.startswith(b'{"id":') or end < 0:
        return None
    try:
        rid = orjson.loads(raw[:end] + b"}")["id"]
    except orjson.JSONDecodeError:
        return None
    return rid if isinstance(rid, str) else None


_AFTER_ID = b',"n":'


@dataclass(slots=True)
class _Scan:
    """What one pass over the journal found."""

    steps: dict[str, list[Step]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # bytes of each kept record's entries
    skipped: int = 0  # bytes of the other entries (records skipped, lines unreadable)


def _scan(path: Path, take: Callable[[str], bool], warn: Callable[[str], None] | None) -> _Scan:
    """The steps of the records ``take`` says yes to, and the bytes of every entry."""
    found = _Scan()
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return found
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            rid = line_id(raw, _AFTER_ID)
            if rid is not None and not take(rid):
                found.skipped += len(raw)
                continue
            try:
                entry = orjson.loads(raw)
                rid, index = entry["id"], int(entry["n"])
                if not take(rid):
                    found.skipped += len(raw)
                    continue
                have = found.steps.setdefault(rid, [])
                if index == len(have):
                    have.append(step_of(entry["step"], have))
                found.sizes[rid] = found.sizes.get(rid, 0) + len(raw)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                found.skipped += len(raw)
                if warn is not None:
                    warn(f"{path}:{lineno}: unreadable checkpoint entry skipped ({err})")
    return found


def read_steps(
    path: Path, skip: set[str], warn: Callable[[str], None] | None = None
) -> dict[str, list[Step]]:
    """The journaled steps of every record not in ``skip``, each with its messages as sent.

    Read-only (``refine status`` reads a journal a live run is appending to): an
    unreadable entry, such as a line being written, is skipped.
    """
    return _scan(path, lambda rid: rid not in skip, warn).steps


def read_record(path: Path, record_id: str) -> list[Step]:
    """The journaled steps of one record (none when it has no entry)."""
    return _scan(path, lambda rid: rid == record_id, None).steps.get(record_id, [])


def _entry(record_id: str, earlier: Sequence[Step], step: Step) -> bytes:
    entry = {"id": record_id, "n": len(earlier), "step": stored_step(step, earlier)}
    return orjson.dumps(entry) + b"\n"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """Append-only JSONL journal with group commit, compacted as records finish.

    ``durable`` makes the finished records' output and trace lines durable; the journal
    calls it before it drops their entries.
    """

    def __init__(self, path: Path, *, fsync: bool = True, durable: Callable[[], None]) -> None:
        self.path = path
        self.fsync = fsync
        self.durable = durable
        self._fh: Any = None
        self._pending: list[bytes] = []
        self._batch = anyio.Event()
        self._wake = anyio.Event()
        self._error: StoreError | None = None
        self._live: dict[str, int] = {}  # bytes of the entries of each record not finished
        self._live_bytes = 0
        self._dead = 0  # bytes of entries whose records finished
        self._hold = 0  # after a compaction failed: the dead bytes to wait for first
        self.saved = 0
        self.compactions = 0

    @property
    def _tmp(self) -> Path:
        return self.path.with_name(f".{self.path.name}.compact")

    def load(self, done: set[str], warn: Callable[[str], None]) -> dict[str, list[Step]]:
        """Repair the tail, then return the steps of every record not in ``done``."""
        repair_tail(self.path, warn)
        try:
            self._tmp.unlink(missing_ok=True)  # a rewrite a kill interrupted
            found = _scan(self.path, lambda rid: rid not in done, warn)
        except OSError as err:
            raise StoreError(f"cannot read {self.path}: {err.strerror}") from err
        self._live = found.sizes
        self._live_bytes = sum(found.sizes.values())
        self._dead = found.skipped
        if self._due():
            self._compacted(self._rewrite_or_warn(set(self._live)), self._dead)
        return found.steps

    def restore(self, steps: Mapping[str, Sequence[Step]], warn: Callable[[str], None]) -> None:
        """Journal records' steps again, durably (before ``load``): those of failed records
        that ``--retry-failed`` takes back from traces.jsonl."""
        if not any(steps.values()):
            return
        repair_tail(self.path, warn)
        data = b"".join(
            _entry(rid, ss[:i], s) for rid, ss in steps.items() for i, s in enumerate(ss)
        )
        try:
            with self.path.open("ab") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as err:
            raise StoreError(f"cannot write checkpoint {self.path}: {err.strerror}") from err

    def open(self) -> None:
        """Open for appending (after ``load``)."""
        try:
            self._fh = self.path.open("ab")
        except OSError as err:
            raise StoreError(f"cannot open checkpoint {self.path}: {err.strerror}") from err

    async def save(self, record_id: str, earlier: Sequence[Step], step: Step) -> None:
        """Append one completed call, which follows ``earlier``; return once it is durable."""
        if self._error is not None:
            raise self._error
        line = _entry(record_id, earlier, step)
        self._pending.append(line)
        self._live[record_id] = self._live.get(record_id, 0) + len(line)
        self._live_bytes += len(line)
        batch = self._batch
        self._wake.set()
        await batch.wait()
        if self._error is not None:
            raise self._error

    def finished(self, record_id: str) -> None:
        """The record's output and trace lines are written: its entries may go once they
        are durable."""
        size = self._live.pop(record_id, 0)
        self._live_bytes -= size
        self._dead += size
        if self._due():
            self._wake.set()

    def _due(self) -> bool:
        return self._dead > 0 and self._dead >= max(self._live_bytes, COMPACT_MIN_BYTES, self._hold)

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
        """The flusher task: write pending entries in batches, compact when due, until
        cancelled."""
        try:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                if self._pending:
                    await self._flush_once()
                if self._error is None and self._due():
                    await self._compact()
                if self._error is not None:
                    return
        finally:
            with anyio.CancelScope(shield=True):
                if self._pending and self._error is None:
                    await self._flush_once()

    async def _compact(self) -> None:
        """Drop the entries of the records finished so far. In the flusher: no entry is
        written meanwhile (saves wait for the next batch)."""
        keep, dead = set(self._live), self._dead

        def rewrite() -> bool:
            self._fh.close()
            done = self._rewrite_or_warn(keep)
            self._fh = self.path.open("ab")
            return done

        try:
            done = await anyio.to_thread.run_sync(rewrite)
        except OSError as err:
            self._error = StoreError(f"cannot reopen checkpoint {self.path}: {err.strerror}")
            return
        self._compacted(done, dead)

    def _compacted(self, done: bool, dead: int) -> None:
        """Count a compaction that dropped ``dead`` bytes, or wait for as much again after
        one that failed."""
        if done:
            self._dead -= dead
            self.compactions += 1
        else:
            self._hold = self._dead + COMPACT_MIN_BYTES

    def _rewrite_or_warn(self, keep: set[str]) -> bool:
        """Rewrite the journal with only ``keep``'s entries, once the other records' lines
        are durable; one that fails leaves the journal as it was, and says so."""
        try:
            self.durable()
            self._rewrite(keep)
        except (OSError, StoreError) as err:
            with contextlib.suppress(OSError):
                self._tmp.unlink(missing_ok=True)
            reason = err.strerror if isinstance(err, OSError) else str(err)
            log.warning("cannot compact %s (%s); it stays as it is for now", self.path, reason)
            return False
        return True

    def _rewrite(self, keep: set[str]) -> None:
        tmp = self._tmp
        with self.path.open("rb") as src, tmp.open("wb") as dst:
            for raw in src:
                rid = line_id(raw, _AFTER_ID)
                if rid is None:
                    with contextlib.suppress(orjson.JSONDecodeError, TypeError, KeyError):
                        rid = orjson.loads(raw)["id"]
                if rid in keep:
                    dst.write(raw)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)

    def close(self) -> None:
        """Close the file (after the flusher has stopped)."""
        if self._fh is not None:
            # After a failed write (disk full) closing retries the flush and fails again;
            # the journal's torn tail is cut off on the next start.
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None

    def compact(self) -> None:
        """Drop the entries of every finished record (at the run's end, once closed): a run
        that finished leaves an empty journal."""
        if self._dead > 0 and self._error is None:
            self._compacted(self._rewrite_or_warn(set(self._live)), self._dead)
