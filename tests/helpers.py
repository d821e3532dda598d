"""Small helpers shared by the tests."""

from __future__ import annotations

from pathlib import Path

import orjson

SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    """Write ``rows`` as a JSONL file."""
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, object]]:
    """Every line of a JSONL file, parsed."""
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def tasks(n: int, start: int = 0) -> list[dict[str, object]]:
    """``n`` distinct code-improve records."""
    return [
        {"id": f"r{i}", "task": f"Write a Python function number {i} that sums a list"}
        for i in range(start, start + n)
    ]
