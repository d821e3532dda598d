"""An input's identity: a run continues only on the input it started with.

JSONL and CSV are identified by the first MiB of their decompressed content, so
appending records (even recompressing the file) keeps the identity while checking it
costs the same whatever the size. Parquet files are not appended in place (the footer
would have to move), so any change is a different input: the SHA-256 of the whole file
(about 0.75 s per GB here, paid when a run starts), skipped when the size, modification
time and footer are unchanged.

A JSONL line the run rejected (into errors.jsonl) may be fixed in place: ``kept_lines``
hashes the whole lines of the first MiB with the rejected ones left out, and
``fixed_in_place`` accepts a file whose only changes there are at those lines.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .formats import detect
from .parquet import parquet_identity
from .streams import DECOMPRESSION_ERRORS, open_bytes

__all__ = ["fingerprint", "fixed_in_place", "kept_lines", "same_input"]

HEAD_BYTES = 1 << 20
_LEFT_OUT = b"\x00rejected\n"  # stands for a rejected line in the digest of the kept ones


def fingerprint(path: Path) -> dict[str, Any]:
    """What identifies the input at ``path`` (stored in the manifest)."""
    fmt = detect(path)
    if fmt.name == "parquet":
        return parquet_identity(path)
    with open_bytes(path, fmt.compression) as fh:
        head = _head(fh, HEAD_BYTES)
    return {
        "format": fmt.name,
        "head_bytes": len(head),
        "head_sha256": hashlib.sha256(head).hexdigest(),
    }


def same_input(path: Path, recorded: dict[str, Any]) -> bool:
    """Whether ``path`` is the recorded input (for JSONL and CSV, possibly with rows appended)."""
    try:
        fmt = detect(path)
    except ConfigError:
        return False
    if fmt.name != recorded.get("format", "jsonl"):  # manifests before Parquet: JSONL
        return False
    if fmt.name == "parquet":
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


def kept_lines(path: Path, rejected: Collection[int]) -> dict[str, Any]:
    """The fingerprint's part that lets the ``rejected`` lines of a JSONL input be fixed
    in place: how many whole lines its first MiB holds, and their digest without those.
    Empty for other formats, or when no line was rejected."""
    fmt = detect(path)
    if not rejected or fmt.name != "jsonl":
        return {}
    with open_bytes(path, fmt.compression) as fh:
        head = _head(fh, HEAD_BYTES + 1)
    lines = head.split(b"\n")
    whole = lines if len(head) <= HEAD_BYTES else lines[:-1]  # the last is cut mid-line
    if whole and not whole[-1]:
        whole = whole[:-1]  # the file ends with a newline
    return {"kept_lines": len(whole), "kept_sha256": _kept_digest(whole, rejected)}


def fixed_in_place(path: Path, recorded: Mapping[str, Any], rejected: Collection[int]) -> bool:
    """Whether the JSONL input at ``path`` differs from the recorded one only at lines it
    rejected (``recorded`` holds ``kept_lines`` from when they were rejected)."""
    count, digest = recorded.get("kept_lines"), recorded.get("kept_sha256")
    if not isinstance(count, int) or not isinstance(digest, str) or not rejected:
        return False
    try:
        fmt = detect(path)
    except ConfigError:
        return False
    if fmt.name != "jsonl":
        return False
    lines: list[bytes] = []
    with open_bytes(path, fmt.compression) as fh:
        try:
            for raw in fh:
                if len(lines) == count:
                    break
                lines.append(raw.rstrip(b"\n"))
        except DECOMPRESSION_ERRORS:
            return False
    return len(lines) == count and _kept_digest(lines, rejected) == digest


def _kept_digest(lines: Sequence[bytes], rejected: Collection[int]) -> str:
    h = hashlib.sha256()
    for number, line in enumerate(lines, start=1):
        h.update(_LEFT_OUT if number in rejected else line + b"\n")
    return h.hexdigest()
