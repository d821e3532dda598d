"""The batch ledger: ``RUN_DIR/batches.jsonl``, what became of every batch a run made.

Append-only, one JSON event a line, each written and fsynced before the driver acts on
it. Replaying the events gives the batches still open; the checkpoint journal stays the
source of truth for which calls are done. The events of one batch, in order::

    intent     token, round, side, model, and the (record, step, format level) of each line;
               written before anything is sent, so no batch can exist that the ledger
               cannot find again (the token is the batch's metadata)
    uploaded   the input file's id
    created    the batch id, right after the API returned it
    cancel     `refine cancel` asked for the batch to be cancelled
    collected  its answered lines are in the journal; the failed calls it counts
    closed     its files are deleted (or it never came to exist): the batch is forgotten

A kill can tear only the last line, which is cut off on the next start. A ledger of
mostly closed batches is rewritten without them (failures of calls still pending kept).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from ...errors import StoreError
from ...runs.journal import repair_tail

__all__ = ["Entry", "Ledger", "LedgerState", "custom_ids", "read_ledger"]

COMPACT_MIN_BYTES = 1 << 20

CallKey = tuple[str, int]  # (record id, step index)


@dataclass(slots=True)
class Entry:
    """One batch the ledger has not forgotten."""

    token: str
    round: int
    side: str
    model: str
    at: float  # Unix time of the intent: listings older than this cannot hold the batch
    calls: list[tuple[str, int, int]]  # line i: (record id, step index, structured level)
    file_id: str | None = None
    batch_id: str | None = None
    cancelled: bool = False
    collected: bool = False
    files: list[str] = field(default_factory=list)  # its input, output and error files

    @property
    def live(self) -> bool:
        """Created and not yet collected: its calls are the provider's."""
        return self.batch_id is not None and not self.collected


@dataclass(slots=True)
class LedgerState:
    """What replaying the ledger gives: open batches, counted failures, the last round."""

    entries: dict[str, Entry] = field(default_factory=dict)
    failures: dict[CallKey, list[int | str]] = field(default_factory=dict)
    rounds: int = 0
    closed: int = 0  # batches forgotten
    calls_seen: int = 0  # lines of every intent replayed, forgotten ones included

    def apply(self, event: Mapping[str, Any]) -> None:
        """Move the state on by one event (unknown events, from newer versions, are ignored)."""
        event_name = event.get("e")
        if event_name == "intent":
            calls = [(str(c[0]), int(c[1]), int(c[2])) for c in event["calls"]]
            entry = Entry(
                str(event["token"]),
                int(event["round"]),
                str(event["side"]),
                str(event["model"]),
                float(event["at"]),
                calls,
            )
            self.entries[entry.token] = entry
            self.rounds = max(self.rounds, entry.round)
            self.calls_seen += len(calls)
            return
        if event_name == "failures":
            for rid, n, statuses in event["calls"]:
                self.failures.setdefault((str(rid), int(n)), []).extend(statuses)
            return
        if event_name == "rounds":
            self.rounds = max(self.rounds, int(event["round"]))
            return
        found = self.entries.get(str(event.get("token")))
        if found is None:
            return
        entry = found
        if event_name == "uploaded":
            entry.file_id = str(event["file_id"])
            entry.files.append(entry.file_id)
        elif event_name == "created":
            entry.batch_id = str(event["batch_id"])
        elif event_name == "cancel":
            entry.cancelled = True
        elif event_name == "collected":
            entry.collected = True
            entry.files.extend(str(f) for f in event.get("files") or ())
            for rid, n, status in event.get("failed") or ():
                self.failures.setdefault((str(rid), int(n)), []).append(status)
        elif event_name == "closed":
            del self.entries[entry.token]
            self.closed += 1

    def live_calls(self) -> dict[str, tuple[str, int]]:
        """Record id -> (token, step index) of every call in a live batch."""
        return {rid: (e.token, n) for e in self.entries.values() if e.live for rid, n, _ in e.calls}


def _events(path: Path, warn: Callable[[str], None] | None) -> Iterable[dict[str, Any]]:
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                event = orjson.loads(raw)
            except orjson.JSONDecodeError as err:
                if warn is not None:
                    warn(f"{path}:{lineno}: unreadable ledger entry skipped ({err})")
                continue
            if isinstance(event, dict):
                yield event


def read_ledger(path: Path, warn: Callable[[str], None] | None = None) -> LedgerState:
    """Replay a ledger (read-only: ``refine status`` reads one a live run appends to)."""
    state = LedgerState()
    if not path.exists():
        return state
    for event in _events(path, warn):
        try:
            state.apply(event)
        except (KeyError, TypeError, ValueError, IndexError) as err:
            if warn is not None:
                warn(f"{path}: malformed ledger event skipped ({err!r})")
    return state


def custom_ids(path: Path) -> dict[str, CallKey]:
    """The call (record id, step index) each custom_id the ledger's intents hold stood for.

    For audits: which of a provider's lines answered which call. A compacted ledger holds
    the intents of open batches only.
    """
    from .lines import custom_id  # here: lines brings the HTTP SDK, which status never needs

    calls: dict[str, CallKey] = {}
    if not path.exists():
        return calls
    for event in _events(path, None):
        if event.get("e") == "intent":
            for i, (rid, n, _) in enumerate(event["calls"]):
                calls[custom_id(str(event["token"]), i)] = (str(rid), int(n))
    return calls


class Ledger:
    """The ledger of one run directory, open for appending, with its replayed state."""

    def __init__(self, path: Path, *, fsync: bool = True, warn: Callable[[str], None]) -> None:
        self.path = path
        self.fsync = fsync
        repair_tail(path, warn)
        try:
            self.state = read_ledger(path, warn)
            self._fh: IO[bytes] = path.open("ab")
        except OSError as err:
            raise StoreError(f"cannot open the batch ledger {path}: {err.strerror}") from err

    def _write(self, events: Iterable[dict[str, Any]]) -> None:
        events = list(events)
        data = b"".join(orjson.dumps(e) + b"\n" for e in events)
        try:
            self._fh.write(data)
            self._fh.flush()
            if self.fsync:
                os.fsync(self._fh.fileno())
        except OSError as err:
            raise StoreError(
                f"cannot write the batch ledger {self.path}: {err.strerror}; "
                "what was saved before is intact and the run can be resumed"
            ) from err
        for event in events:
            self.state.apply(event)

    def intent(self, token: str, round_: int, side: str, model: str, calls: list[Any]) -> Entry:
        """Record a batch about to be made; its entry."""
        event = {
            "e": "intent",
            "token": token,
            "round": round_,
            "side": side,
            "model": model,
            "at": round(time.time(), 3),
            "calls": calls,
        }
        self._write([event])
        return self.state.entries[token]

    def uploaded(self, token: str, file_id: str) -> None:
        """Record the batch's input file."""
        self._write([{"e": "uploaded", "token": token, "file_id": file_id}])

    def created(self, token: str, batch_id: str) -> None:
        """Record the id the provider gave the batch."""
        self._write([{"e": "created", "token": token, "batch_id": batch_id}])

    def cancel(self, token: str) -> None:
        """Record that the batch was asked to cancel."""
        self._write([{"e": "cancel", "token": token}])

    def collected(
        self, token: str, status: str, failed: list[tuple[str, int, int | str]], files: list[str]
    ) -> None:
        """Record a collected batch: the failed calls to count, the files left to delete."""
        event = {"e": "collected", "token": token, "status": status, "failed": failed}
        self._write([{**event, "files": files}])

    def closed(self, token: str, why: str) -> None:
        """Forget a batch: its files are deleted, or it never came to exist."""
        self._write([{"e": "closed", "token": token, "why": why}])

    def compact(self, pending: Callable[[str, int], bool]) -> None:
        """Rewrite a ledger that is mostly forgotten batches without them.

        ``pending(record_id, index)`` says whether a call is still to be made, so its
        counted failures are kept.
        """
        try:
            big = self.path.stat().st_size >= COMPACT_MIN_BYTES
        except OSError:
            return
        open_calls = sum(len(e.calls) for e in self.state.entries.values())
        if not big or open_calls * 2 > self.state.calls_seen:
            return
        state = self.state
        failures = [[rid, n, s] for (rid, n), s in state.failures.items() if pending(rid, n)]
        events: list[dict[str, Any]] = [{"e": "rounds", "round": state.rounds}]
        if failures:
            events.append({"e": "failures", "calls": failures})
        for e in state.entries.values():
            events.append(
                {
                    "e": "intent",
                    "token": e.token,
                    "round": e.round,
                    "side": e.side,
                    "model": e.model,
                    "at": e.at,
                    "calls": [list(c) for c in e.calls],
                }
            )
            if e.file_id is not None:
                events.append({"e": "uploaded", "token": e.token, "file_id": e.file_id})
            if e.batch_id is not None:
                events.append({"e": "created", "token": e.token, "batch_id": e.batch_id})
            if e.cancelled:
                events.append({"e": "cancel", "token": e.token})
            if e.collected:
                extra = [f for f in e.files if f != e.file_id]
                events.append({"e": "collected", "token": e.token, "failed": [], "files": extra})
        tmp = self.path.with_name(f".{self.path.name}.compact")
        try:
            with tmp.open("wb") as fh:
                fh.write(b"".join(orjson.dumps(ev) + b"\n" for ev in events))
                fh.flush()
                os.fsync(fh.fileno())
            self._fh.close()
            os.replace(tmp, self.path)
            self._fh = self.path.open("ab")
        except OSError as err:
            raise StoreError(f"cannot rewrite the batch ledger {self.path}: {err}") from err
        self.state = LedgerState()
        for ev in events:
            self.state.apply(ev)

    def close(self) -> None:
        """Close the file."""
        with contextlib.suppress(OSError):
            self._fh.close()
