"""Sending a job to a Ray worker: its files travel, and the worker loads them itself.

A loaded ``Job`` cannot be pickled in general (hooks may hold caches and other objects
bound to their module), and a worker may run on a machine without the job's files. So
the driver sends the job file and its hooks file as bytes; the worker writes them under
its temporary directory, in the same relative layout, loads the job and checks that its
content hash is the one the run records.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ...core.jobs import Job
from ...core.loader import load_job
from ...errors import ConfigError, JobError

__all__ = ["JobFiles"]


@dataclass(frozen=True, slots=True)
class JobFiles:
    """A job file and its hooks file, as bytes."""

    name: str  # the job file's name
    toml: bytes
    hooks: tuple[str, bytes] | None  # ``hooks.file`` as the job file writes it, and its bytes
    content_hash: str

    @classmethod
    def of(cls, job: Job) -> JobFiles:
        """The files of a loaded job."""
        path = Path(job.source)
        try:
            raw = path.read_bytes()
            hooks_file = tomllib.loads(raw.decode("utf-8")).get("hooks", {}).get("file")
            hooks = None
            if hooks_file is not None:
                if PurePosixPath(hooks_file).is_absolute():
                    raise ConfigError(
                        f"{path}: hooks.file is an absolute path, which a Ray worker on another "
                        "machine may not have; give it relative to the job file"
                    )
                hooks = (str(hooks_file), (path.parent / hooks_file).read_bytes())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            raise JobError(str(path), "file", f"cannot read it again to send it: {err}") from err
        return cls(path.name, raw, hooks, job.content_hash)

    def load(self, root: Path | None = None) -> Job:
        """Write the files under ``root`` (the temporary directory) and load the job."""
        base = (root or Path(tempfile.gettempdir())) / "refine-jobs" / self.content_hash
        # A hooks path may climb out of the job's folder ("../common.py"): nest as deep.
        climbs = 0 if self.hooks is None else PurePosixPath(self.hooks[0]).parts.count("..")
        folder = base.joinpath(*["job"] * (climbs + 1))
        _write(folder / self.name, self.toml)
        if self.hooks is not None:
            _write(folder / self.hooks[0], self.hooks[1])
        job = load_job(str(folder / self.name))
        if job.content_hash != self.content_hash:
            raise ConfigError(
                f"the job {job.name!r} loaded on a Ray worker differs from the driver's "
                f"({job.content_hash} != {self.content_hash})"
            )
        return job


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: workers on one machine may write it at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError(f"a Ray worker cannot write the job to {path}: {err.strerror}") from err
