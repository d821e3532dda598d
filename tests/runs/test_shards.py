"""`--shard I/N` splits a run by record id; `refine merge` joins the shards' run directories."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline import ConfigError, RunDirError, Settings, resume, run, run_status
from pipeline.commands.merge import merge
from pipeline.runs.rundir import RunDir
from pipeline.runs.shards import shard_of
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl

REFINE = [sys.executable, "-m", "pipeline.cli"]
IDS = [f"r{i}" for i in range(500)] + [str(i) for i in range(500)] + ["é€", "", "h" + "0" * 16]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 16])
def test_every_id_has_one_shard_and_shards_are_even(count: int) -> None:
    """Each id maps to one shard in 0..N-1, and no shard gets less than half its share."""
    shards = Counter(shard_of(rid, count) for rid in IDS)
    assert set(shards) <= set(range(count))
    assert min(shards[i] for i in range(count)) >= len(IDS) / count / 2


def test_shards_do_not_depend_on_the_process() -> None:
    """Another interpreter (another hash seed, another machine) puts every id in the same shard."""
    code = (
        "import sys, orjson; from pipeline.runs.shards import shard_of; "
        "print(orjson.dumps([shard_of(i, 7) for i in orjson.loads(sys.stdin.read())]).decode())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=orjson.dumps(IDS).decode(),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        check=True,
    )
    assert orjson.loads(out.stdout) == [shard_of(i, 7) for i in IDS]


N_RECORDS = 30
BAD_LINES = [b"{not json\n", b'{"id": "x", "task": 5}\n']


@pytest.fixture(scope="module")
def shard_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The three finished shard runs of one input (with two unreadable lines), made once."""
    root = tmp_path_factory.mktemp("shards")
    inp = root / "in.jsonl"
    write_jsonl(inp, tasks(N_RECORDS))
    with inp.open("ab") as fh:
        fh.writelines(BAD_LINES)
    with Simulator(SimConfig(latency_s=0.0)) as sim:
        for i in range(3):
            run(
                "code-improve",
                inp,
                root / f"s{i}",
                shard_settings(sim.url, i, 3),
                show_progress=False,
            )
    yield root


def shard_settings(url: str, index: int, count: int, **kw: Any) -> Settings:
    """Shard ``index`` of ``count`` of a generation-only run."""
    return Settings(model="sim-model", base_url=url, max_iters=0, shard=(index, count), **kw)


def copy(shard_runs: Path, tmp_path: Path, *names: str) -> list[Path]:
    """Private copies of the shared shard runs."""
    return [Path(shutil.copytree(shard_runs / n, tmp_path / n)) for n in names]


def test_shards_partition_the_input(shard_runs: Path) -> None:
    """Every record is in exactly one shard's outputs; each shard reports every unreadable line."""
    ids = [o["id"] for i in range(3) for o in read_jsonl(shard_runs / f"s{i}" / "outputs.jsonl")]
    assert sorted(ids) == sorted(f"r{i}" for i in range(N_RECORDS))
    for i in range(3):
        outs = read_jsonl(shard_runs / f"s{i}" / "outputs.jsonl")
        assert outs and all(shard_of(str(o["id"]), 3) == i for o in outs)
        assert [e["line"] for e in read_jsonl(shard_runs / f"s{i}" / "errors.jsonl")] == [31, 32]


def test_status_of_a_finished_shard_counts_its_share(shard_runs: Path) -> None:
    """`refine status` of a shard names it and counts its own records, none pending."""
    info = run_status(shard_runs / "s1")
    done = len(read_jsonl(shard_runs / "s1" / "outputs.jsonl"))
    assert info["shard"] == "1/3" and info["state"] == "finished"
    assert info["records"] == info["done"] == done and info["pending"] == 0


def test_merge_joins_shards_into_one_run(shard_runs: Path, tmp_path: Path) -> None:
    """The merged directory reads as the whole run: each record and bad line once, with traces."""
    summary = merge(tmp_path / "all", [shard_runs / f"s{i}" for i in (2, 0, 1)])
    out = tmp_path / "all"
    outs = read_jsonl(out / "outputs.jsonl")
    assert sorted(o["id"] for o in outs) == sorted(f"r{i}" for i in range(N_RECORDS))
    traces = read_jsonl(out / "traces.jsonl")
    assert sorted(t["id"] for t in traces) == sorted(o["id"] for o in outs)
    assert [e["line"] for e in read_jsonl(out / "errors.jsonl")] == [31, 32]
    assert summary.complete and summary.shards == (0, 1, 2) and summary.done == N_RECORDS
    assert summary.exit_code == 1  # the two unreadable lines
    info = run_status(out)
    assert info["shard"] is None and info["state"] == "finished"
    assert (info["records"], info["done"], info["pending"], info["bad_lines"]) == (
        N_RECORDS,
        N_RECORDS,
        0,
        2,
    )
    manifest = RunDir(out).require_manifest()
    assert manifest.runs == 3 and manifest.settings.shard is None


def refuse(shard_runs: Path, tmp_path: Path, case: str) -> tuple[Path, list[Path]]:
    """Run directories that ``merge`` must refuse, by case."""
    s0, s1, s2 = copy(shard_runs, tmp_path, "s0", "s1", "s2")
    out = tmp_path / "all"
    dirs = [s0, s1, s2]
    if case == "twice":
        dirs = [s0, s1, s2, Path(shutil.copytree(s1, tmp_path / "s1-again"))]
    elif case == "missing":
        dirs = [s0, s2]
    elif case == "overlap":
        line = (s1 / "outputs.jsonl").read_bytes().splitlines(keepends=True)[0]
        with (s0 / "outputs.jsonl").open("ab") as fh:
            fh.write(line)
    elif case == "unfinished":
        rd = RunDir(s2)
        rd.write_manifest(rd.require_manifest().finished("interrupted", 130))
    elif case == "not a shard":
        rd = RunDir(s2)
        m = rd.require_manifest()
        rd.write_manifest(type(m).from_json({**m.to_json(), "settings": {"shard": None}}))
    elif case == "out used":
        out.mkdir()
        (out / "outputs.jsonl").write_bytes(b"")
    else:  # another run's shard: a different identity, N or input
        rd = RunDir(s2)
        fields = rd.require_manifest().to_json()
        key, value = {
            "other N": ("settings", {**fields["settings"], "shard": [2, 4]}),
            "other job": ("job", {**fields["job"], "hash": "0" * 64}),
            "other model": ("model", "another-model"),
            "other iters": ("settings", {**fields["settings"], "max_iters": 3}),
            "other input": ("input", {**fields["input"], "fingerprint": {"size": 1}}),
            "other limit": ("settings", {**fields["settings"], "limit": 20}),
        }[case]
        rd.write_manifest(type(rd.require_manifest()).from_json({**fields, key: value}))
    return out, dirs


@pytest.mark.parametrize(
    ("case", "error", "words", "partial_ok"),
    [
        ("twice", RunDirError, "both shard 1", False),
        ("missing", ConfigError, "shard(s) 1 of 3 are missing", True),
        ("overlap", RunDirError, "the shards overlap", False),
        ("unfinished", ConfigError, "has not finished", True),
        ("not a shard", ConfigError, "not a shard run", False),
        ("out used", ConfigError, "new directory", False),
        ("other N", RunDirError, "not one of 3", False),
        ("other job", RunDirError, "job.hash", False),
        ("other model", RunDirError, "model", False),
        ("other iters", RunDirError, "max_iters", False),
        ("other input", RunDirError, "input fingerprint", False),
        ("other limit", RunDirError, "limit", False),
    ],
)
def test_merge_refuses_shards_that_do_not_make_one_run(
    shard_runs: Path,
    tmp_path: Path,
    case: str,
    error: type[Exception],
    words: str,
    partial_ok: bool,
) -> None:
    """Bad shard sets are refused with the reason; --partial admits missing and unfinished."""
    out, dirs = refuse(shard_runs, tmp_path, case)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        merge(out, dirs)
    if case != "out used":  # a refused merge leaves OUT_DIR as it was
        assert not out.exists() or not any(out.iterdir())
    if partial_ok:
        merge(out, dirs, partial=True)
    else:
        with pytest.raises(error):
            merge(out, dirs, partial=True)


def test_a_partial_merge_resumes_into_the_whole_run(shard_runs: Path, tmp_path: Path) -> None:
    """Merging two of three shards with partial, then `refine resume`, finishes the other third."""
    dirs = copy(shard_runs, tmp_path, "s0", "s2")
    out = tmp_path / "all"
    summary = merge(out, dirs, partial=True)
    assert not summary.complete and summary.exit_code == 1
    info = run_status(out)
    missing = len(read_jsonl(shard_runs / "s1" / "outputs.jsonl"))
    assert info["state"] == "partial" and info["pending"] == missing
    with Simulator(SimConfig(latency_s=0.0)) as sim:
        m = RunDir(out).require_manifest()
        RunDir(out).write_manifest(
            type(m).from_json(
                {**m.to_json(), "settings": {**m.to_json()["settings"], "base_url": sim.url}}
            )
        )
        done = resume(out, show_progress=False)
    assert done.exit_code == 1  # the two unreadable lines
    assert sorted(o["id"] for o in read_jsonl(out / "outputs.jsonl")) == sorted(
        f"r{i}" for i in range(N_RECORDS)
    )


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`refine` as a CI job runs it."""
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    return subprocess.run(
        [*REFINE, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_the_readme_ci_matrix(tmp_path: Path) -> None:
    """Four `refine run --shard I/4` jobs, then `refine merge runs/all runs/shard-*`: one run."""
    inp = write_jsonl(tmp_path / "tasks.jsonl", tasks(24))
    with Simulator(SimConfig(latency_s=0.0)) as sim:
        for i in range(4):
            done = cli(
                "run", "code-improve", str(inp), "--out", f"runs/shard-{i}", "--shard", f"{i}/4",
                "--base-url", sim.url, "--model", "sim-model", "--max-iters", "1", "--quiet",
                cwd=tmp_path,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
    shards = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "runs").glob("shard-*"))
    merged = cli("merge", "runs/all", *shards, cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    assert "merged shard(s) 0, 1, 2, 3 of 4" in merged.stdout
    status = cli("status", "runs/all", "--json", cwd=tmp_path)
    info = orjson.loads(status.stdout)
    assert (info["done"], info["pending"], info["state"]) == (24, 0, "finished")
    again = cli("merge", "runs/all", *shards, cwd=tmp_path)
    assert again.returncode == 2 and "new directory" in again.stderr
