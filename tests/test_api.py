"""The Python API's error contract: what stops a run from starting is raised; once it has
started, however it ends is returned as a RunSummary (exit status, message, error)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import ConfigError, FatalCallError, JobError, RunSummary, Settings, run
from pipeline.backends.realtime import RealTimeBackend
from pipeline.core.steps import Completion, ModelClient, Request
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import tasks, write_jsonl


class Misconfigured(ModelClient):
    """A model client that finds, at its first call, that it cannot work at all."""

    model = "m"

    async def complete(self, request: Request) -> Completion:
        raise ConfigError("this client was set up wrong")


def test_what_stops_a_run_from_starting_is_raised(tmp_path: Path) -> None:
    """An unknown job, a bad setting: raised, no run directory written."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(1))
    with pytest.raises(JobError, match="no such built-in job"):
        run("no-such-job", inp, tmp_path / "run", Settings(base_url="http://x/v1"))
    with pytest.raises(ConfigError, match="--concurrency"):
        run("code-improve", inp, tmp_path / "run", Settings(base_url="http://x/v1", concurrency=0))
    assert not (tmp_path / "run").exists()


def test_an_error_once_started_is_returned_with_its_exit_status(tmp_path: Path) -> None:
    """A configuration error found by the first call is the summary's (exit 2, error set),
    not an exception, as an unknown model found by the endpoint is."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    summary = run(
        "code-improve", inp, tmp_path / "a", Settings(max_iters=0),
        backend=RealTimeBackend(Misconfigured()),
        show_progress=False,
    )  # fmt: skip
    assert isinstance(summary, RunSummary)
    assert (summary.exit_code, summary.state) == (2, "stopped")
    assert isinstance(summary.error, ConfigError) and "set up wrong" in (summary.message or "")
    with Simulator(SimConfig(models=("sim-model",))) as sim:
        wrong = Settings(model="sim-modle", base_url=sim.url, max_iters=0)
        summary = run("code-improve", inp, tmp_path / "b", wrong, api_key="k", show_progress=False)
    assert summary.exit_code == 2 and isinstance(summary.error, FatalCallError)


def test_a_finished_run_has_no_error(sim: Simulator, tmp_path: Path) -> None:
    """A run that finished has exit 0 and no error."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    settings = Settings(model="sim-model", base_url=sim.url, max_iters=0)
    summary = run("code-improve", inp, tmp_path / "run", settings, api_key="k", show_progress=False)
    assert (summary.exit_code, summary.error, summary.message) == (0, None, None)
