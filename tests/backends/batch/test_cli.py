"""`refine run --batch` and `refine cancel` as users run them: subprocesses and exit statuses."""

from __future__ import annotations

from pathlib import Path

from pipeline.runs.rundir import RunDir
from tests.cli.test_cli import refine
from tests.helpers import tasks, write_jsonl


def test_batch_refuses_the_local_model(tmp_path: Path) -> None:
    """--batch with --local is refused at once (exit 2): the local server has no Batch API."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(1))
    out = refine(
        "run", "code-improve", str(inp), "--out", str(tmp_path / "r"), "--batch", "--local"
    )
    assert out.returncode == 2 and "Batch API" in out.stderr
    assert not (tmp_path / "r").exists()  # refused before the run directory was made


def test_cancel_refuses_a_run_in_progress(tmp_path: Path) -> None:
    """`refine cancel` on a run another process holds exits 2, saying to stop that run first."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(1))
    run_dir = tmp_path / "run"
    first = refine(
        "run", "code-improve", str(inp), "--out", str(run_dir), "--batch",
        "--base-url", "http://127.0.0.1:9/v1", "--max-outage", "0.1", "--poll", "0.1",
        "--quiet",
    )  # fmt: skip
    assert first.returncode == 2, first.stderr  # nothing listens there: cannot reach it
    assert "cannot reach http://127.0.0.1:9/v1" in first.stderr
    with RunDir(run_dir).lock():
        out = refine("cancel", str(run_dir))
    assert out.returncode == 2 and "stop that run first" in out.stderr


def test_cancel_of_a_directory_without_a_run(tmp_path: Path) -> None:
    """`refine cancel` on a directory that holds no run exits 2 with a clear message."""
    out = refine("cancel", str(tmp_path))
    assert out.returncode == 2 and "holds no run" in out.stderr
