"""scripts/bench_local.py's pieces that run without a model: the repeated request file."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.scripts import load_script


def test_repeat_sends_each_request_that_many_times_under_ids_of_their_own(tmp_path: Path) -> None:
    bench = load_script("bench_local")
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"id": "a", "task": "one"}\n{"id": "b", "task": "two"}\n\n')
    out = bench.repeated(source, 3, tmp_path / "out.jsonl")
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [row["id"] for row in rows] == ["a", "b", "a~2", "b~2", "a~3", "b~3"]
    assert [row["task"] for row in rows] == ["one", "two"] * 3
    assert bench.repeated(source, 1, tmp_path / "unused.jsonl") == source
    assert not (tmp_path / "unused.jsonl").exists()
