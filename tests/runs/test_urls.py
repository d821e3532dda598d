"""The endpoint belongs to the run: re-runs and resumes keep it, naming another is recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline import Manifest, Settings, resume, run
from pipeline.runs.manifest import InputInfo, JobInfo
from pipeline.runs.urls import carry_endpoints, endpoint_use, record_endpoints
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl


def manifest_of(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((run_dir / "manifest.json").read_bytes())
    return data


def chat_calls(sim: Simulator) -> int:
    return sum(1 for r in sim.requests if not r.is_batch)


@pytest.fixture
def no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither an OpenAI key nor a base URL in the environment: OpenAI cannot be reached."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def test_rerun_without_base_url_keeps_the_runs_endpoint(
    sim: Simulator, tmp_path: Path, no_openai_env: None
) -> None:
    """A re-run naming no endpoint sends its calls to the manifest's, never to OpenAI."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    first = Settings(model="sim-model", base_url=sim.url, max_iters=1)
    assert run("code-improve", inp, tmp_path / "run", first, show_progress=False).exit_code == 0
    before = chat_calls(sim)
    write_jsonl(inp, tasks(4))  # two records appended
    again = Settings(model="sim-model", max_iters=1)  # no --base-url, no key, no $OPENAI_*
    summary = run("code-improve", inp, tmp_path / "run", again, show_progress=False)
    assert summary.exit_code == 0, summary.message
    assert chat_calls(sim) > before
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 4
    m = manifest_of(tmp_path / "run")
    assert m["settings"]["base_url"] == sim.url
    assert [e["base_url"] for e in m["endpoints"]] == [[sim.url]]


def test_environment_url_does_not_move_an_existing_run(
    sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_openai_env: None
) -> None:
    """$OPENAI_BASE_URL set later does not take a run elsewhere; only --base-url does."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    first = Settings(model="sim-model", base_url=sim.url, max_iters=1)
    run("code-improve", inp, tmp_path / "run", first, show_progress=False)
    write_jsonl(inp, tasks(3))
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    summary = run(
        "code-improve", inp, tmp_path / "run", Settings(model="sim-model", max_iters=1),
        show_progress=False,
    )  # fmt: skip
    assert summary.exit_code == 0, summary.message
    assert manifest_of(tmp_path / "run")["settings"]["base_url"] == sim.url


def test_a_new_run_records_the_environment_url(
    sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_openai_env: None
) -> None:
    """A new run's $OPENAI_BASE_URL is recorded, so a resume without it goes there too."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    monkeypatch.setenv("OPENAI_BASE_URL", sim.url)
    settings = Settings(model="sim-model", max_iters=1, limit=1)
    run("code-improve", inp, tmp_path / "run", settings, show_progress=False)
    assert manifest_of(tmp_path / "run")["settings"]["base_url"] == sim.url
    monkeypatch.delenv("OPENAI_BASE_URL")
    m = tmp_path / "run" / "manifest.json"
    data = manifest_of(tmp_path / "run")
    data["settings"]["limit"] = None
    m.write_bytes(orjson.dumps(data))
    summary = resume(tmp_path / "run", show_progress=False)
    assert summary.exit_code == 0, summary.message
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 2


def test_resume_of_an_earlier_manifest_uses_its_recorded_url(
    sim: Simulator, tmp_path: Path, no_openai_env: None
) -> None:
    """A manifest from before endpoints were kept in the settings (the URL only at the top
    level, as $OPENAI_BASE_URL left it) resumes on that URL."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    settings = Settings(model="sim-model", base_url=sim.url, max_iters=1, limit=1)
    run("code-improve", inp, tmp_path / "run", settings, show_progress=False)
    data = manifest_of(tmp_path / "run")
    data["settings"].update(base_url=None, limit=None)
    del data["endpoints"]
    (tmp_path / "run" / "manifest.json").write_bytes(orjson.dumps(data))
    summary = resume(tmp_path / "run", show_progress=False)
    assert summary.exit_code == 0, summary.message
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 3
    history = manifest_of(tmp_path / "run")["endpoints"]
    assert [e["base_url"] for e in history] == [[sim.url]]


def test_naming_another_endpoint_is_allowed_and_recorded(
    sim: Simulator, tmp_path: Path, no_openai_env: None
) -> None:
    """--base-url on a re-run moves the run; the history keeps both endpoints, no key."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    first = Settings(model="sim-model", base_url=sim.url, max_iters=1)
    run("code-improve", inp, tmp_path / "run", first, api_key="sk-secret", show_progress=False)
    write_jsonl(inp, tasks(4))
    with Simulator(SimConfig(p_done=0.3)) as other:
        moved = Settings(model="sim-model", base_url=other.url, max_iters=1)
        summary = run(
            "code-improve", inp, tmp_path / "run", moved, api_key="sk-secret", show_progress=False
        )
        assert summary.exit_code == 0
        assert chat_calls(other) > 0
    m = manifest_of(tmp_path / "run")
    assert [(e["base_url"], e["since_run"]) for e in m["endpoints"]] == [
        ([sim.url], 1),
        ([other.url], 2),
    ]
    assert b"sk-secret" not in (tmp_path / "run" / "manifest.json").read_bytes()


def test_the_critics_endpoint_is_kept_too(tmp_path: Path, no_openai_env: None) -> None:
    """A re-run naming no --feedback-base-url sends the critic's calls where they went."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    with (
        Simulator(SimConfig(p_done=0.0)) as gen,
        Simulator(SimConfig(p_done=0.0)) as critic,
    ):
        first = Settings(
            model="sim-model", base_url=gen.url, feedback_model="sim-critic",
            feedback_base_url=critic.url, max_iters=1,
        )  # fmt: skip
        run("code-improve", inp, tmp_path / "run", first, show_progress=False)
        before = chat_calls(critic)
        write_jsonl(inp, tasks(4))
        again = Settings(model="sim-model", feedback_model="sim-critic", max_iters=1)
        summary = run("code-improve", inp, tmp_path / "run", again, show_progress=False)
        assert summary.exit_code == 0, summary.message
        assert chat_calls(critic) > before
        assert {r.model for r in critic.requests} == {"sim-critic"}


def old_run(**settings: Any) -> Manifest:
    """A manifest of an earlier invocation with these settings."""
    return Manifest(
        job=JobInfo("code-improve", "h", "code-improve"),
        input=InputInfo("/in.jsonl", {}),
        model="m",
        feedback_model=None,
        base_url=None,
        settings=Settings(**settings),
    )


@pytest.mark.parametrize(
    ("asked", "old", "env", "kept"),
    [
        (
            Settings(),
            old_run(base_url=("http://a/v1", "http://b/v1")),
            {},
            ("http://a/v1", "http://b/v1"),
        ),
        (
            Settings(),
            old_run(base_url="http://a/v1"),
            {"OPENAI_BASE_URL": "http://e/v1"},
            "http://a/v1",
        ),
        (Settings(base_url="http://n/v1"), old_run(base_url="http://a/v1"), {}, "http://n/v1"),
        (Settings(), None, {"OPENAI_BASE_URL": "http://e/v1"}, "http://e/v1"),
        (Settings(), None, {}, None),  # a new run with nothing given: OpenAI, said in the log
        (Settings(), old_run(), {"OPENAI_BASE_URL": "http://e/v1"}, None),  # it was on OpenAI
        (Settings(local=True), old_run(base_url="http://a/v1"), {}, None),  # the embedded model
    ],
)
def test_which_endpoint_an_invocation_uses(
    asked: Settings, old: Manifest | None, env: dict[str, str], kept: object
) -> None:
    """--base-url wins; else the run's own (replicas too), never $OPENAI_BASE_URL; a new
    run takes $OPENAI_BASE_URL, else OpenAI."""
    settings, note = carry_endpoints(asked, old, env)
    assert settings.base_url == kept
    assert (note is not None) == (old is not None and "OPENAI_BASE_URL" in env)


def test_the_history_grows_only_when_the_endpoint_changes() -> None:
    """An invocation at the same endpoints adds no entry; another endpoint adds one, with
    a note for the log."""
    first = old_run(base_url="http://a/v1")
    use_a = endpoint_use(("http://a/v1",), False, None, 2)
    same, note = record_endpoints(first, first, use_a)
    assert [e.base_url for e in same.endpoints] == [("http://a/v1",)] and note is None
    moved, note = record_endpoints(same, same, endpoint_use(("http://u:pw@b/v1",), False, None, 3))
    assert [e.base_url for e in moved.endpoints] == [("http://a/v1",), ("http://b/v1",)]
    assert note is not None and "now go to http://b/v1" in note and "pw" not in note
