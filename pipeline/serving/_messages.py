"""What the local-model code tells the user: notes on stderr, sizes, the tail of a log."""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["human_size", "log_stderr", "read_tail", "tail"]


def log_stderr(message: str) -> None:
    """A ``refine:`` note on stderr, so stdout stays clean for the caller."""
    print(f"refine: {message}", file=sys.stderr, flush=True)


def human_size(size: int) -> str:
    """Bytes as a short decimal figure: ``491 MB``, ``1.12 GB``."""
    if size >= 1_000_000_000:
        return f"{size / 1e9:.2f} GB"
    if size >= 1_000_000:
        return f"{size / 1e6:.0f} MB"
    return f"{size} bytes"


def tail(text: str, lines: int = 25) -> str:
    """The last ``lines`` lines of ``text``, for error messages."""
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join(kept) if kept else "(no output)"


def read_tail(path: Path, lines: int = 25, limit: int = 64 * 1024) -> str:
    """The last lines of a log file, reading at most its last ``limit`` bytes."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(handle.tell() - limit, 0))
            data = handle.read()
    except OSError as err:
        return f"(cannot read {path}: {err})"
    return tail(data.decode("utf-8", "replace"), lines)
