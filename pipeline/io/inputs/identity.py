"""An input's identity: a run continues only on the input it started with.

JSONL and CSV are identified by the first MiB of their decompressed content, so
appending records (even recompressing the file) keeps the identity while checking it
costs the same whatever the size. Parquet files are not appended in place (the footer
would have to move), so any change is a different input: the SHA-256 of the whole file
(about 0.75 s per GB here, paid when a run starts), skipped when the size, modification
time and footer are unchanged.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .formats import detect
from .parquet import parquet_identity
from .streams import DECOMPRESSION_ERRORS, open_bytes

__all__ = ["fingerprint", "same_input"]

HEAD_BYTES = 1 << 20


def fingerprint(path: Path) -> dict[str, Any]:
    """What identifies the input at ``path`` (stored in the manifest)."""
    fmt = detect(path)
    if fmt.kind == "parquet":
        return parquet_identity(path)
    with open_bytes(path, fmt.compression) as fh:
        head = _head(fh, HEAD_BYTES)
    return {
        "format": fmt.kind,
        "head_bytes": len(head),
        "head_sha256": hashlib.sha256(head).hexdigest(),
    }


def same_input(path: Path, recorded: dict[str, Any]) -> bool:
    """Whether ``path`` is the recorded input (for JSONL and CSV, possibly with rows appended)."""
    try:
        fmt = detect(path)
    except ConfigError:
        return False
    if fmt.kind != recorded.get("format", "jsonl"):  # manifests before Parquet: JSONL
        return False
    if fmt.kind == "parquet":
        quick = parquet_identity(path, digest=False)
        if all(recorded.get(k) == v for k, v in quick.items()):
            return True
        if quick["size"] != recorded.get("size"):
            return False
        return bool(parquet_identity(path)["sha256"] == recorded.get("sha256"))
    n = int(recorded["head_bytes"])
    with open_bytes(path, fmt.compression) as fh:
        head = _head(fh, n)
    return len(head) == n and hashlib.sha256(head).hexdigest() == recorded["head_sha256"]


def _head(fh: io.BufferedIOBase, n: int) -> bytes:
    """Up to ``n`` bytes from the start; a stream cut short gives what it held."""
    parts: list[bytes] = []
    got = 0
    try:
        while got < n:
            chunk = fh.read(min(n - got, 1 << 16))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
    except DECOMPRESSION_ERRORS:
        pass
    return b"".join(parts)
