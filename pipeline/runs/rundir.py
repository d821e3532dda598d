"""The run directory: where each file lives, its manifest, its lock and its live progress."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from ..errors import ConfigError, RunDirError, RunLocked, StoreError
from ..io.records import count_lines, count_records
from .manifest import Manifest, now_iso

__all__ = ["Expected", "RunDir", "write_json_atomic"]


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


@dataclass(frozen=True, slots=True)
class Expected:
    """How many records a run ends with: its input lines (the first --limit) less the unreadable."""

    input_lines: int | None  # non-blank lines (rows) of the input; None when it cannot be read
    bad_lines: int
    limit: int | None
    sharded: bool = False  # a shard's share of the input is known only once it is read

    @property
    def records(self) -> int | None:
        """Records the run ends with, when the input can be read and the run is not a shard."""
        if self.input_lines is None or self.sharded:
            return None
        lines = self.input_lines if self.limit is None else min(self.input_lines, self.limit)
        return lines - self.bad_lines

    def describe(self) -> str:
        """``first N of M lines`` under --limit, else ``M lines``."""
        if self.input_lines is None:
            return "input no longer readable"
        if self.limit is not None and self.limit < self.input_lines:
            return f"first {self.limit} of {self.input_lines} lines"
        return f"{self.input_lines} lines"


@dataclass(slots=True)
class RunDir:
    """Paths and manifest handling of one RUN_DIR."""

    path: Path

    @property
    def manifest_path(self) -> Path:
        """``manifest.json``."""
        return self.path / "manifest.json"

    @property
    def journal_path(self) -> Path:
        """The journal (``checkpoint.jsonl``: the name older runs resume from)."""
        return self.path / "checkpoint.jsonl"

    @property
    def outputs_path(self) -> Path:
        """One line per finished record."""
        return self.path / "outputs.jsonl"

    @property
    def traces_path(self) -> Path:
        """Every call of every finished record."""
        return self.path / "traces.jsonl"

    @property
    def errors_path(self) -> Path:
        """Input lines that could not become records."""
        return self.path / "errors.jsonl"

    @property
    def batches_path(self) -> Path:
        """The Batch API ledger (``--batch``)."""
        return self.path / "batches.jsonl"

    @property
    def progress_path(self) -> Path:
        """The live progress snapshot read by ``refine status``."""
        return self.path / "progress.json"

    @property
    def lock_path(self) -> Path:
        """The run lock."""
        return self.path / "lock"

    def read_manifest(self) -> Manifest | None:
        """The manifest, or None when the directory has none yet."""
        try:
            data = orjson.loads(self.manifest_path.read_bytes())
        except FileNotFoundError:
            return None
        except NotADirectoryError as err:
            raise ConfigError(f"{self.path} is not a directory") from err
        except OSError as err:
            raise StoreError(f"cannot read {self.manifest_path}: {err.strerror}") from err
        except orjson.JSONDecodeError as err:
            raise RunDirError(f"{self.manifest_path}: not valid JSON ({err})") from err
        if not isinstance(data, dict):
            raise RunDirError(f"{self.manifest_path}: not a JSON object")
        return Manifest.from_json(data, str(self.manifest_path))

    def require_manifest(self) -> Manifest:
        """The manifest; ConfigError when the directory holds no run."""
        manifest = self.read_manifest()
        if manifest is None:
            raise ConfigError(f"{self.path} holds no run (no manifest.json)")
        return manifest

    def write_manifest(self, manifest: Manifest) -> None:
        """Replace manifest.json atomically."""
        write_json_atomic(self.manifest_path, manifest.to_json())

    def expected(self, manifest: Manifest) -> Expected:
        """The records this run ends with, counted from its input and errors.jsonl."""
        try:
            lines: int | None = count_records(Path(manifest.input.path))
        except (OSError, ConfigError):
            lines = None
        bad = count_lines(self.errors_path) if self.errors_path.exists() else 0
        return Expected(lines, bad, manifest.settings.limit, manifest.settings.shard is not None)

    def is_locked(self) -> bool:
        """Whether a live process holds the run lock (a dead one's lock is free)."""
        try:
            fh = self.lock_path.open("r")
        except OSError:
            return False  # no lock file: no process ever held it
        with fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return False

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the RUN_DIR lock; a lock left by a dead process is free (the OS drops it)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fh: IO[str] = self.lock_path.open("a+")
        except OSError as err:
            raise StoreError(f"cannot use run directory {self.path}: {err.strerror}") from err
        try:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise StoreError(f"cannot lock {self.lock_path}: {err.strerror}") from err
                fh.seek(0)
                holder = fh.read().strip() or "another process"
                raise RunLocked(
                    f"{self.path} is in use by {holder}; wait for it to finish "
                    f"(`refine status {self.path}` shows its progress)"
                ) from err
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

    def read_progress(self) -> dict[str, Any] | None:
        """The last progress snapshot, or None."""
        try:
            data = orjson.loads(self.progress_path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None
