"""The run directory: its manifest, its lock and its live progress snapshot."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import orjson

from .errors import RunDirError, RunLocked, StoreError

__all__ = ["RunDir", "now_iso", "write_json_atomic"]

# Settings that change what a run computes: a different value on an existing
# RUN_DIR is refused. The others (pace, timeouts, concurrency) may change.
IDENTITY = ("job.name", "job.hash", "model", "max_iters", "min_iters", "checks", "id_field")


def now_iso() -> str:
    """The current UTC time, ISO 8601, second precision."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def write_json_atomic(path: Path, obj: Any) -> None:
    """Replace ``path`` with ``obj`` as JSON, never leaving a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StoreError(f"cannot write {path}: {err.strerror}") from err


def _get(d: Mapping[str, Any], dotted: str) -> Any:
    node: Any = d
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


@dataclass(slots=True)
class RunDir:
    """Paths and manifest handling of one RUN_DIR."""

    path: Path

    @property
    def manifest_path(self) -> Path:
        """``manifest.json``."""
        return self.path / "manifest.json"

    @property
    def checkpoint_path(self) -> Path:
        """The checkpoint journal."""
        return self.path / "checkpoint.jsonl"

    @property
    def progress_path(self) -> Path:
        """The live progress snapshot read by ``refine status``."""
        return self.path / "progress.json"

    def read_manifest(self) -> dict[str, Any] | None:
        """The manifest, or None when the directory has none yet."""
        try:
            data: dict[str, Any] = orjson.loads(self.manifest_path.read_bytes())
        except FileNotFoundError:
            return None
        except orjson.JSONDecodeError as err:
            raise RunDirError(f"{self.manifest_path}: not valid JSON ({err})") from err
        return data

    def check_same(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """Refuse to continue a run whose job, model or settings that shape results differ."""
        for key in IDENTITY:
            if _get(old, key) != _get(new, key):
                raise RunDirError(
                    f"{self.path} holds a run with {key}={_get(old, key)!r}, not "
                    f"{_get(new, key)!r}; use another --out, or `refine resume {self.path}`"
                )

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the RUN_DIR lock; a lock left by a dead process is free (the OS drops it)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fh: IO[str] = (self.path / "lock").open("a+")
        except OSError as err:
            raise StoreError(f"cannot use run directory {self.path}: {err.strerror}") from err
        try:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                fh.seek(0)
                holder = fh.read().strip() or "another process"
                raise RunLocked(
                    f"{self.path} is in use by {holder}; wait for it to finish "
                    f"(`refine status {self.path}` shows its progress)"
                ) from None
            with contextlib.suppress(OSError):
                fh.seek(0)
                fh.truncate()
                fh.write(f"pid {os.getpid()} since {now_iso()}\n")
                fh.flush()
            yield
        finally:
            fh.close()

    def write_progress(self, snapshot: Mapping[str, Any]) -> None:
        """Publish a progress snapshot (best effort: a full disk must not stop the run here)."""
        with contextlib.suppress(StoreError):
            write_json_atomic(self.progress_path, {**snapshot, "updated_at": time.time()})
