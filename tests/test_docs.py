"""The docs' worked example runs as written, and the docs stay short enough to read."""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline.backends
from pipeline import Settings, run
from pipeline.backends import named
from pipeline.core.loader import load_job
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl
from tests.helpers import sent as sent_of

ROOT = Path(__file__).resolve().parents[1]
FILE_BLOCK = re.compile(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```", re.DOTALL)
MAX_DOC_LINES = 400


def files_of(doc: Path, into: Path) -> dict[str, Path]:
    """Write each ``<!-- file: NAME -->`` block of ``doc`` into ``into``."""
    out = {}
    for name, text in FILE_BLOCK.findall(doc.read_text()):
        out[name] = into / name
        out[name].parent.mkdir(parents=True, exist_ok=True)
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


def test_the_add_a_backend_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/architecture.md's serial backend, loaded as ``pipeline.backends.serial``, is
    found by name and runs a job against the simulator one record at a time: each record's
    calls are made together, in input order, none between another record's."""
    init = files_of(ROOT / "docs" / "architecture.md", tmp_path)["serial/__init__.py"]
    name = "pipeline.backends.serial"
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(init.parent)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    assert named("serial").name == "serial"
    # the doc's step 3, the one line mapping settings to a name
    monkeypatch.setattr(pipeline.backends, "name_of", lambda settings: "serial")
    records = tasks(4)
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    with Simulator(SimConfig(p_done=0.0)) as sim:
        settings = Settings(base_url=sim.url, max_iters=1, concurrency=8)
        summary = run(
            "code-improve", inp, tmp_path / "run", settings, api_key="k", show_progress=False
        )
        bodies = sim.completed_bodies()
    assert summary.exit_code == 0, summary.message
    outputs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert sorted(o["id"] for o in outputs) == [r["id"] for r in records]
    assert {o["status"] for o in outputs} == {"done"}
    # each call's record, in the order the server answered them (a finished run's journal
    # is empty: its calls are in traces.jsonl)
    called = [next(r["id"] for r in records if r["task"] in str(b["messages"])) for b in bodies]
    assert len(called) == 4 * 4  # per record: generate, feedback, refine, feedback
    assert [rid for rid, _ in itertools.groupby(called)] == [r["id"] for r in records]


def test_no_page_of_the_docs_is_too_long_to_read() -> None:
    """README.md and every page under docs/ hold at most 400 lines."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    long = {p.name: n for p in pages if (n := len(p.read_text().splitlines())) > MAX_DOC_LINES}
    assert long == {}
