"""The docs' worked example runs as written, and the docs stay short enough to read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from pipeline.core.loader import load_job
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, write_jsonl
from tests.helpers import sent as sent_of

ROOT = Path(__file__).resolve().parents[1]
FILE_BLOCK = re.compile(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```", re.DOTALL)
MAX_DOC_LINES = 400


def files_of(doc: Path, into: Path) -> dict[str, Path]:
    """Write each ``<!-- file: NAME -->`` block of ``doc`` into ``into``."""
    out = {}
    for name, text in FILE_BLOCK.findall(doc.read_text()):
        out[name] = into / name
        out[name].write_text(text)
    return out


def test_the_worked_example_job_runs_as_written(tmp_path: Path) -> None:
    """docs/jobs.md's headline job loads, runs against the simulator with the commands the
    page gives, and its check's findings reach the critic and the refinement."""
    files = files_of(ROOT / "docs" / "jobs.md", tmp_path)
    assert set(files) == {"headline.toml", "headline_hooks.py"}
    job = load_job(str(files["headline.toml"]))
    assert job.checker is not None and job.checker({}, "Short news.") == [
        "Drop the final period: headlines have none."
    ]
    articles = [{"id": f"a{i}", "article": f"Article {i}: the town fair opened."} for i in range(4)]
    inp = write_jsonl(tmp_path / "articles.jsonl", articles)
    env = {**os.environ, "OPENAI_API_KEY": "k"}
    with Simulator(SimConfig(p_done=0.0)) as sim:
        for command in (
            ["run", str(files["headline.toml"]), str(inp), "--out", str(tmp_path / "run"),
             "--max-iters", "2", "--base-url", sim.url],
            ["report", str(tmp_path / "run")],
        ):  # fmt: skip
            done = subprocess.run(
                [sys.executable, "-m", "pipeline.cli", *command],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
    outputs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert [o["status"] for o in outputs] == ["done"] * 4
    found = 0
    for trace in read_jsonl(tmp_path / "run" / "traces.jsonl"):
        answers = [s for s in trace["steps"] if s.get("iteration_answer")]
        for step, asked in zip(trace["steps"], sent_of(trace), strict=True):
            if step["role"] != "refine":
                continue
            sent = "\n".join(m["content"] for m in asked)
            for answer in (a for a in answers if a["iteration"] < step["iteration"]):
                found += len(answer.get("checks") or [])
                assert all(finding in sent for finding in answer.get("checks") or [])
    assert found > 0
    assert (tmp_path / "run" / "report" / "index.html").is_file()


def test_the_api_example_runs_as_written(tmp_path: Path) -> None:
    """docs/api.md's example runs as written against the simulator (its URL given the way a
    new run takes it from the environment) and prints the summary's exit status."""
    files = files_of(ROOT / "docs" / "api.md", tmp_path)
    write_jsonl(tmp_path / "tasks.jsonl", [{"id": "t1", "task": "Sum a list."}])
    with Simulator(SimConfig()) as sim:
        env = {**os.environ, "OPENAI_API_KEY": "k", "OPENAI_BASE_URL": sim.url}
        done = subprocess.run(
            [sys.executable, str(files["run_tasks.py"])],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("0 1/1 records finished")
    assert [o["status"] for o in read_jsonl(tmp_path / "runs" / "tasks" / "outputs.jsonl")] == [
        "done"
    ]


def test_no_page_of_the_docs_is_too_long_to_read() -> None:
    """README.md and every page under docs/ hold at most 400 lines."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    long = {p.name: n for p in pages if (n := len(p.read_text().splitlines())) > MAX_DOC_LINES}
    assert long == {}
