"""Backends chosen by name: the lookup, a backend given in place of the named one, and what
each opens (clients given need no key; endpoints it opened are reached before any call)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline import ConfigError, Settings, UnreachableError, run
from pipeline.backends import chosen, name_of, named
from pipeline.backends.batch import BatchBackend
from pipeline.backends.realtime import RealTimeBackend
from pipeline.testing.simulator import SimConfig, Simulator
from tests.fakes import ScriptedClient
from tests.helpers import read_jsonl, tasks, write_jsonl


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        (Settings(), "realtime"),
        (Settings(batch=True), "batch"),
        (Settings(workers=2), "ray"),
    ],
)
def test_the_settings_name_a_backend_found_by_that_name(settings: Settings, name: str) -> None:
    """--batch names the Batch API backend, --workers Ray's, else real time; each module
    ``pipeline.backends.<name>`` builds the backend of that name (importing no Ray)."""
    assert name_of(settings) == name
    assert named(name).name == name
    assert chosen(settings).name == name


def test_a_given_backend_must_be_the_one_the_settings_name(tmp_path: Path) -> None:
    """A real-time backend given to a --batch run is refused before anything is written."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(1))
    settings = Settings(batch=True, base_url="http://unused.invalid/v1")
    with pytest.raises(ConfigError, match=r"'realtime'.*'batch'"):
        run("code-improve", inp, tmp_path / "run", settings, backend=RealTimeBackend())
    assert not (tmp_path / "run").exists()


def test_clients_given_need_no_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a key or URL the calls would go to OpenAI and the run is refused; over
    clients given it runs, and opens none."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    settings = Settings(model="fake-model", max_iters=0)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        run("code-improve", inp, tmp_path / "a", settings, show_progress=False)
    client = ScriptedClient(default="```python\ndef f():\n    return 1\n```")
    backend = RealTimeBackend(client)
    summary = run("code-improve", inp, tmp_path / "b", settings, backend=backend)
    assert summary.exit_code == 0, summary.message
    assert len(client.messages) == 2


def closed_port() -> str:
    """The URL of a port nothing listens on (a simulator's, once it stopped)."""
    with Simulator(SimConfig()) as sim:
        return sim.url


def test_batch_backend_reaches_its_endpoint_before_any_batch(tmp_path: Path) -> None:
    """--batch at a URL that refuses connections stops at once (exit 2), no file uploaded:
    the Batch API endpoint is reached first, as real time's client is."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    url = closed_port()
    started = time.monotonic()
    summary = run(
        "code-improve",
        inp,
        tmp_path / "run",
        Settings(batch=True, base_url=url, max_outage=60.0),
        api_key="k",
        backend=BatchBackend(),
        show_progress=False,
    )
    assert summary.exit_code == 2 and isinstance(summary.error, UnreachableError)
    assert f"cannot reach {url}" in (summary.message or "")
    assert time.monotonic() - started < 30
    assert read_jsonl(tmp_path / "run" / "batches.jsonl") == []


def test_ray_backend_reaches_the_endpoint_before_starting_ray(tmp_path: Path) -> None:
    """--workers at a URL that refuses connections stops at once (exit 2) without Ray ever
    being started: the driver asks the endpoint before any worker opens a client."""
    ray = pytest.importorskip("ray")
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    url = closed_port()
    summary = run(
        "code-improve",
        inp,
        tmp_path / "run",
        Settings(workers=2, base_url=url),
        api_key="k",
        show_progress=False,
    )
    assert summary.exit_code == 2 and isinstance(summary.error, UnreachableError)
    assert not ray.is_initialized()
