"""Writing outputs: ``outputs.jsonl``, ``traces.jsonl`` and ``errors.jsonl``.

Each file is append-only and keyed (outputs and traces by record id, errors by
input line), so a resumed run writes every key exactly once: on open the torn
tail is repaired and the keys already present are read back. ``--retry-failed``
is the one rewrite: the failed records' lines are dropped (traces first, so an
interrupted rewrite leaves no output without its trace) and the records run again.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from ..core.steps import Outcome
from ..core.trace import trace_line
from ..errors import InputError, StoreError
from .journal import line_id, repair_tail

__all__ = ["RAW_LIMIT", "KeyedJsonl", "Outputs", "rejected_lines"]

RAW_LIMIT = 200  # characters of a broken input line kept in errors.jsonl


class KeyedJsonl:
    """An append-only JSONL file that remembers which keys it holds."""

    def __init__(
        self,
        path: Path,
        key: str,
        warn: Callable[[str], None],
        count: str | None = None,
        after_id: bytes | None = None,
    ) -> None:
        self.path = path
        self.key = key
        self.count = count
        self.counts: Counter[Any] = Counter()
        repair_tail(path, warn)
        self.keys: set[Any] = set()
        if path.exists():
            with path.open("rb") as fh:
                for lineno, raw in enumerate(fh, start=1):
                    # A large line whose id comes first, then ``after_id``: read the id only.
                    rid = None if after_id is None else line_id(raw, after_id)
                    if rid is not None:
                        self.keys.add(rid)
                        continue
                    try:
                        obj = orjson.loads(raw)
                        if obj[key] in self.keys:
                            continue
                        self.keys.add(obj[key])
                        if count is not None:
                            self.counts[obj.get(count)] += 1
                    except (orjson.JSONDecodeError, KeyError, TypeError):
                        warn(f"{path}:{lineno}: unreadable line ignored")
        try:
            self._fh: IO[bytes] = path.open("ab")
        except OSError as err:
            raise StoreError(f"cannot open {path}: {err.strerror}") from err

    def append(self, obj: dict[str, Any]) -> bool:
        """Write ``obj`` unless its key is already there; return whether it was written."""
        k = obj[self.key]
        if k in self.keys:
            return False
        try:
            self._fh.write(orjson.dumps(obj) + b"\n")
            self._fh.flush()
        except OSError as err:
            raise StoreError(f"cannot write {self.path}: {err.strerror}") from err
        self.keys.add(k)
        if self.count is not None:
            self.counts[obj.get(self.count)] += 1
        return True

    def sync(self) -> None:
        """Make what was written durable."""
        try:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as err:
            raise StoreError(f"cannot write {self.path}: {err.strerror}") from err

    def drop(self, keys: set[Any]) -> int:
        """Rewrite the file without the lines of ``keys``; return how many were dropped."""
        if not keys & self.keys:
            return 0
        tmp = self.path.with_name(f".{self.path.name}.rewrite")
        dropped = 0
        try:
            self._fh.close()
            with self.path.open("rb") as src, tmp.open("wb") as dst:
                for raw in src:
                    try:
                        obj = orjson.loads(raw)
                        key = obj[self.key]
                    except (orjson.JSONDecodeError, KeyError, TypeError):
                        key = None
                    if key in keys:
                        dropped += 1
                        if self.count is not None:
                            self.counts[obj.get(self.count)] -= 1
                        continue
                    dst.write(raw)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, self.path)
            self._fh = self.path.open("ab")
        except OSError as err:
            raise StoreError(f"cannot rewrite {self.path}: {err.strerror}") from err
        self.keys -= keys
        return dropped

    def close(self) -> None:
        """Close the file (a failed final flush leaves a torn line, repaired on resume)."""
        with contextlib.suppress(OSError):
            self._fh.close()


class Outputs:
    """The three output files of a run directory."""

    def __init__(self, run_dir: Path, warn: Callable[[str], None]) -> None:
        self.outputs = KeyedJsonl(run_dir / "outputs.jsonl", "id", warn, count="status")
        self.traces = KeyedJsonl(run_dir / "traces.jsonl", "id", warn, after_id=b',"steps":')
        self.errors = KeyedJsonl(run_dir / "errors.jsonl", "line", warn)

    @property
    def finished(self) -> set[str]:
        """Ids of records that already have their output line."""
        return self.outputs.keys

    def finish(self, outcome: Outcome, cost_usd: float | None = None) -> None:
        """Write a finished record: its trace first, then its output line (which marks it done)."""
        self.traces.append(trace_line(outcome))
        self.outputs.append(outcome.output_line(cost_usd))

    def failed_ids(self) -> set[str]:
        """Ids of records whose output line says ``failed``."""
        ids: set[str] = set()
        if not self.outputs.counts.get("failed"):
            return ids
        with self.outputs.path.open("rb") as fh:
            for raw in fh:
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(obj, dict) and obj.get("status") == "failed":
                    ids.add(str(obj["id"]))
        return ids

    def reopen(self, ids: set[str]) -> None:
        """Take finished records back to run again: their traces, then their output lines."""
        self.traces.drop(ids)
        self.outputs.drop(ids)

    def bad_line(self, err: InputError) -> bool:
        """Record an input line that could not become a record (once per line)."""
        return self.errors.append(
            {
                "line": err.line,
                "error": err.reason if err.field is None else f"{err.field}: {err.reason}",
                "field": err.field,
                "raw": None if err.raw is None else err.raw[:RAW_LIMIT],
            }
        )

    def sync_records(self) -> None:
        """Make the finished records' lines durable: traces, then outputs (safe to call
        from another thread while records are written)."""
        self.traces.sync()
        self.outputs.sync()

    def sync(self) -> None:
        """Flush all three files to disk."""
        for f in (self.outputs, self.traces, self.errors):
            f.sync()

    def close(self) -> None:
        """Close all three files."""
        for f in (self.outputs, self.traces, self.errors):
            f.close()


def rejected_lines(path: Path) -> set[int]:
    """The input lines an errors.jsonl holds (none when it does not exist)."""
    lines: set[int] = set()
    if not path.exists():
        return lines
    with path.open("rb") as fh:
        for raw in fh:
            try:
                line = orjson.loads(raw)["line"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue  # a torn last line
            if isinstance(line, int):
                lines.add(line)
    return lines
