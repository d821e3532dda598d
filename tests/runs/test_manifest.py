"""The typed manifest, the settings in force, and the run directory's helpers."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import orjson
import pytest

from pipeline import ConfigError, RunDirError, Settings, run
from pipeline.runs.manifest import InputInfo, JobInfo, Manifest, refuse_different
from pipeline.runs.rundir import Expected, RunDir
from pipeline.runs.settings import DEFAULT_TIMEOUT_S, LOCAL_TIMEOUT_S, parse_shard, resolve
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import tasks, write_jsonl


def manifest(**settings: object) -> Manifest:
    return Manifest(
        job=JobInfo("code-improve", "abc", "code-improve"),
        input=InputInfo("/data/in.jsonl", {"head_bytes": 10, "head_sha256": "x"}),
        model="gpt-4o-mini",
        feedback_model=None,
        base_url="https://api.example.com/v1",
        settings=resolve(Settings(**settings), 3),  # type: ignore[arg-type]
    )


def test_round_trip_keeps_every_field() -> None:
    """to_json then from_json gives the same manifest, tuples and all."""
    m = manifest(base_url=("http://a/v1", "http://b/v1"), shard=(1, 4), budget=2.5)
    assert Manifest.from_json(orjson.loads(orjson.dumps(m.to_json()))) == m


def test_effective_values_are_stored() -> None:
    """The manifest holds the values in force: the job's max_iters and the timeout, never null."""
    assert manifest().settings.max_iters == 3
    assert manifest().settings.timeout == DEFAULT_TIMEOUT_S
    assert manifest(local=True).settings.timeout == LOCAL_TIMEOUT_S
    assert manifest(timeout=7.0, max_iters=1).settings.timeout == 7.0


def test_credentials_in_urls_never_reach_the_manifest() -> None:
    """A user:password or a query token in a base URL is dropped from every field."""
    m = manifest(
        base_url="https://user:secret@host:8443/v1?key=secret",
        feedback_base_url="http://u:secret@c/v1",
    )
    text = orjson.dumps(m.to_json()).decode()
    assert "secret" not in text and "https://host:8443/v1" in text


def test_earlier_layout_is_read() -> None:
    """Manifests written before settings were typed (top-level max_iters etc.) still load."""
    old = {
        "job": {"name": "gsm", "hash": "h", "source": "gsm"},
        "model": "local:qwen2.5-coder-0.5b",
        "base_url": "http://127.0.0.1:5555/v1",
        "max_iters": 2,
        "min_iters": 1,
        "checks": False,
        "id_field": "key",
        "settings": {"local": True, "timeout": None, "concurrency": 4, "unknown_future": 1},
        "input": {"path": "/x", "fingerprint": {"head_bytes": 1, "head_sha256": "y"}},
    }
    m = Manifest.from_json(old)
    s = m.settings
    assert (s.max_iters, s.min_iters, s.checks, s.id_field, s.local) == (2, 1, False, "key", True)
    assert s.base_url is None  # the local server's port is not an endpoint to reuse


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"max_iters": 1}, "max_iters"),
        ({"min_iters": 1}, "min_iters"),
        ({"checks": False}, "checks"),
        ({"id_field": "key"}, "id_field"),
        ({"batch": True}, "batch"),
        ({"shard": (0, 2)}, "shard"),
    ],
)
def test_identity_refuses_what_changes_results(change: dict[str, object], key: str) -> None:
    """A setting that changes what is computed is refused on the same RUN_DIR, by name."""
    with pytest.raises(RunDirError, match=key):
        refuse_different(manifest(), manifest(**change), "runs/x")


@pytest.mark.parametrize(
    "change",
    [
        {"concurrency": 9},
        {"rpm": 100.0},
        {"budget": 1.0},
        {"limit": 5},
        {"base_url": "http://o/v1"},
    ],
)
def test_identity_allows_how_a_run_proceeds(change: dict[str, object]) -> None:
    """Pace, budget, --limit and the endpoint may change between invocations."""
    refuse_different(manifest(), manifest(**change), "runs/x")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (Settings(concurrency=0), "--concurrency"),
        (Settings(max_iters=-1), "--max-iters"),
        (Settings(max_iters=1, min_iters=2), "--min-iters"),
        (Settings(detach=True), "--detach needs --batch"),
        (Settings(budget=0.0), "--budget"),
        (Settings(workers=2, batch=True), "--workers and --batch"),
    ],
)
def test_resolve_names_the_flag(settings: Settings, message: str) -> None:
    """Bad settings are refused with the flag's name."""
    with pytest.raises(ConfigError, match=message):
        resolve(settings, 3)


@pytest.mark.parametrize(
    ("text", "ok"), [("0/2", (0, 2)), ("3/4", (3, 4)), ("2/2", None), ("a/b", None)]
)
def test_parse_shard(text: str, ok: tuple[int, int] | None) -> None:
    """--shard I/N needs 0 <= I < N."""
    if ok is None:
        with pytest.raises(ConfigError, match="--shard"):
            parse_shard(text)
    else:
        assert parse_shard(text) == ok


def test_require_manifest_and_is_locked(tmp_path: Path) -> None:
    """require_manifest refuses an empty directory; is_locked sees a live holder only."""
    rd = RunDir(tmp_path / "run")
    with pytest.raises(ConfigError, match="holds no run"):
        rd.require_manifest()
    assert not rd.is_locked()
    with rd.lock():
        # another open file description, as another process would have
        fd = os.open(rd.lock_path, os.O_RDONLY)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
        assert rd.is_locked()
    assert not rd.is_locked()


@pytest.mark.parametrize(
    ("expected", "records", "text"),
    [
        (Expected(10, 1, None), 9, "10 lines"),
        (Expected(10, 1, 4), 3, "first 4 of 10 lines"),
        (Expected(3, 0, 4), 3, "3 lines"),
        (Expected(None, 0, None), None, "input no longer readable"),
        (Expected(10, 0, None, sharded=True), None, "10 lines"),
    ],
)
def test_expected_records(expected: Expected, records: int | None, text: str) -> None:
    """One count of expected records: lines (up to --limit) less the unreadable ones."""
    assert (expected.records, expected.describe()) == (records, text)


def test_run_writes_a_typed_manifest(tmp_path: Path) -> None:
    """A run's manifest reads back as a Manifest with its state, model and settings in force."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    with Simulator(SimConfig(p_done=1.0)) as sim:
        s = Settings(model="sim-model", base_url=sim.url)
        run("code-improve", inp, tmp_path / "run", s, api_key="sk-x", show_progress=False)
    m = RunDir(tmp_path / "run").require_manifest()
    assert (m.state, m.exit_code, m.model, m.runs) == ("finished", 0, "sim-model", 1)
    assert (m.settings.max_iters, m.settings.timeout) == (3, DEFAULT_TIMEOUT_S)
    assert m.input.path == str(inp.resolve())


def test_resume_keeps_the_local_model_a_run_started_with(tmp_path: Path) -> None:
    """A run started on the default local model (and a local critic) resumes on the models
    its manifest records, not on whatever the default is now; a model named stays named."""
    from dataclasses import replace

    from pipeline.runner import resume_args
    from pipeline.serving import DEFAULT_MODEL

    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    started = replace(
        manifest(local=True, feedback_model="local"),
        model="local:older-default",
        feedback_model="local:older-critic",
    )
    rd.manifest_path.write_bytes(orjson.dumps(started.to_json()))
    _, _, settings = resume_args(rd.path)
    assert (settings.local_model, settings.feedback_model) == (
        "older-default",
        "local:older-critic",
    )
    assert DEFAULT_MODEL != "older-default"

    named = replace(manifest(local=True, local_model="my.gguf"), model="local:my")
    rd.manifest_path.write_bytes(orjson.dumps(named.to_json()))
    assert resume_args(rd.path)[2].local_model == "my.gguf"
    remote = manifest()
    rd.manifest_path.write_bytes(orjson.dumps(remote.to_json()))
    assert resume_args(rd.path)[2] == remote.settings
