"""The Ray worker's side, in this process: job files, wire errors, and the exchange protocol."""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from pipeline import render_status
from pipeline.backends.ray.jobfiles import JobFiles
from pipeline.backends.ray.messages import (
    Assignment,
    Event,
    Finished,
    Halted,
    Orders,
    Report,
    Saved,
    WireError,
)
from pipeline.backends.ray.worker import Worker, WorkerSpec
from pipeline.client.models import ModelId
from pipeline.client.prices import PriceBook
from pipeline.core.loader import load_job
from pipeline.core.records import Record
from pipeline.core.steps import Outcome, Request, Step
from pipeline.core.trace import step_of, stored_step
from pipeline.errors import AuthError, BudgetReached, ConfigError, FatalCallError, UnavailableError
from pipeline.runs.clients import Endpoint
from pipeline.runs.settings import Settings, resolve
from pipeline.sandbox import SandboxMode
from pipeline.testing.simulator import SimConfig, Simulator

pytestmark = pytest.mark.anyio

HOOKED_JOB = """
name = "shout"
[input.text]
type = "string"
[prompts]
generate = "Say {{text}}"
feedback = "Judge the answer above"
refine = "Fix it as the feedback says"
[feedback]
schema = '''
{"type": "object", "required": ["actions", "done"],
 "properties": {"actions": {"type": "array", "items": {"type": "string"}},
                "done": {"type": "boolean"}}}
'''
[hooks]
file = "HOOKS"
"""
HOOKS = """
import functools

@functools.lru_cache(maxsize=8)
def _loud(text):
    return text.upper()

def check(fields, output):
    return [] if output == _loud(output) else ["not loud enough"]
"""


def write_job(folder: Path, hooks_path: str) -> Path:
    """A job file whose hooks (holding an lru_cache: not picklable) live at ``hooks_path``."""
    job = folder / "jobs" / "shout.toml"
    job.parent.mkdir(parents=True)
    job.write_text(HOOKED_JOB.replace("HOOKS", hooks_path))
    hooks = (job.parent / hooks_path).resolve()
    hooks.parent.mkdir(parents=True, exist_ok=True)
    hooks.write_text(HOOKS)
    return job


@pytest.mark.parametrize("hooks_path", ["shout_hooks.py", "../common/shout_hooks.py"])
def test_a_job_with_hooks_travels_as_files(tmp_path: Path, hooks_path: str) -> None:
    """A worker loads the same job (same hash, working hooks) from its files in another place."""
    job = load_job(str(write_job(tmp_path / "driver", hooks_path)))
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        pickle.dumps(job)
    files = pickle.loads(pickle.dumps(JobFiles.of(job)))
    loaded = files.load(tmp_path / "worker")
    assert loaded.content_hash == job.content_hash
    assert (tmp_path / "worker") in Path(loaded.source).parents
    assert loaded.checker is not None and loaded.checker({}, "quiet") == ["not loud enough"]


def test_a_builtin_job_travels_as_files(tmp_path: Path) -> None:
    """A built-in job with hooks (gsm) loads on a worker with the driver's content hash."""
    job = load_job("gsm")
    loaded = JobFiles.of(job).load(tmp_path)
    assert loaded.content_hash == job.content_hash and loaded.evaluator is not None


def test_an_absolute_hooks_path_is_refused(tmp_path: Path) -> None:
    """A hooks file named by an absolute path may not exist on a worker's machine: refused."""
    job = load_job(str(write_job(tmp_path, str(tmp_path / "elsewhere" / "hooks.py"))))
    with pytest.raises(ConfigError, match="absolute path"):
        JobFiles.of(job)


def test_a_job_that_loads_differently_is_refused(tmp_path: Path) -> None:
    """Files whose content does not hash to the run's job are refused on the worker."""
    files = JobFiles.of(load_job("code-improve"))
    forged = JobFiles(files.name, files.toml + b"\n# changed\n", files.hooks, files.content_hash)
    with pytest.raises(ConfigError, match="differs"):
        forged.load(tmp_path)


@pytest.mark.parametrize(
    "err",
    [
        AuthError("auth", "HTTP 401: bad key", status=401),
        UnavailableError("unavailable", "down for 300 s", status=503),
        FatalCallError("not_found", "HTTP 404: no such model", status=404),
        BudgetReached("budget reached: $1 of $1"),
    ],
)
def test_run_stopping_errors_cross_processes(err: FatalCallError | BudgetReached) -> None:
    """An error that stops the run arrives at the driver as the same class, message and status."""
    if isinstance(err, FatalCallError):
        with pytest.raises(TypeError):
            pickle.loads(pickle.dumps(err))  # why the wire form exists
    back = pickle.loads(pickle.dumps(WireError.of(err))).error()
    assert type(back) is type(err) and str(back) == str(err)
    if isinstance(err, FatalCallError):
        assert isinstance(back, FatalCallError)
        assert (back.category, back.status) == (err.category, err.status)


@dataclass
class Driver:
    """Plays the driver's part against a Worker in this process."""

    worker: Worker
    instance: str
    events: list[Event] = field(default_factory=list)
    acks: list[int] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)

    async def exchange(self, *, ack: bool = True, **kw: object) -> Report:
        """One exchange; the steps it brings are acknowledged in the next one when ``ack``."""
        req = Orders(self.instance, acks=tuple(self.acks), poll_s=0.05, **kw)  # type: ignore[arg-type]
        self.acks = []
        report = await self.worker.exchange(req)
        self.reports.append(report)
        self.events += report.events
        if ack:
            self.acks = [e.seq for e in report.events if isinstance(e, Saved)]
        return report

    async def until(
        self, done: Callable[[list[Event]], bool], *, ack: bool = True, **first: object
    ) -> None:
        """Exchange until ``done`` holds for the events so far; ``first`` goes in the first one."""
        with anyio.fail_after(20):
            while not done(self.events):
                await self.exchange(ack=ack, **first)
                first = {}


def spec(url: str, **settings: object) -> WorkerSpec:
    """What a worker of a code-improve run against ``url`` is built from."""
    job = load_job("code-improve")
    s = resolve(Settings(model="sim-model", base_url=url, **settings), job.max_iters)  # type: ignore[arg-type]
    endpoint = Endpoint("sim-model", ModelId("sim-model"), (url,), "json_schema", None)
    return WorkerSpec(JobFiles.of(job), s, endpoint, None, PriceBook(), budgeted=False)


@asynccontextmanager
async def started(
    config: SimConfig | None = None, key: str = "k", **settings: object
) -> AsyncIterator[tuple[Driver, Simulator]]:
    """A simulator (10 ms latency unless ``config``) and a started Worker against it."""
    with Simulator(config or SimConfig(latency_s=0.01)) as sim:
        worker = Worker(spec(sim.url, **settings))
        instance = await worker.start(key)
        try:
            yield Driver(worker, instance), sim
        finally:
            await worker.close()


def record(i: int = 0) -> Record:
    """A code-improve record."""
    return Record(f"r{i}", i + 1, {"task": f"Write function number {i}"})


def finished(n: int) -> Callable[[list[Event]], bool]:
    """Whether ``n`` records have been reported back."""
    return lambda events: sum(isinstance(e, Finished | Halted) for e in events) >= n


async def test_a_loop_waits_for_the_driver_to_journal_each_step() -> None:
    """No call is made until the driver has acknowledged the step before it."""
    async with started(max_iters=2) as (driver, sim):
        await driver.until(lambda ev: bool(ev), ack=False, assign=(Assignment(record()),))
        for _ in range(3):  # unacknowledged: the loop stays put
            await driver.exchange(ack=False)
        assert len(sim.requests) == 1 and len(driver.events) == 1
        saved = driver.events[0]
        assert isinstance(saved, Saved) and (saved.record_id, saved.index) == ("r0", 0)
        driver.acks = [saved.seq]
        await driver.until(lambda ev: len(ev) >= 2)
        assert len(sim.requests) == 2


async def test_finished_records_carry_only_steps_not_journaled() -> None:
    """A finished record brings no journaled step again; a call failed for good, it does."""
    config = SimConfig(latency_s=0.0)
    async with started(config, max_iters=0) as (driver, _):
        await driver.until(finished(1), assign=(Assignment(record()),))
    done = next(e for e in driver.events if isinstance(e, Finished)).outcome
    assert done.status == "done" and done.steps == () and done.output
    async with started(SimConfig(p_refusal=1.0), max_iters=0) as (driver, _):
        await driver.until(finished(1), assign=(Assignment(record()),))
    failed = next(e for e in driver.events if isinstance(e, Finished)).outcome
    assert failed.status == "failed" and len(failed.steps) == 1 and failed.steps[0].failed
    assert not [e for e in driver.events if isinstance(e, Saved)]


async def test_a_record_resumes_from_the_steps_it_is_given() -> None:
    """Given its journaled steps, a record's loop goes on from there: no call is repeated."""
    async with started(max_iters=1) as (driver, sim):
        await driver.until(lambda ev: bool(ev), ack=False, assign=(Assignment(record()),))
        first = driver.events[0]
        assert isinstance(first, Saved) and first.step["role"] == "generate"
    async with started(max_iters=1) as (driver, sim):
        given = (step_of(first.step, []),)
        await driver.until(finished(1), assign=(Assignment(record(), given),))
        roles = [e.step["role"] for e in driver.events if isinstance(e, Saved)]
        assert roles[0] == "feedback" and "generate" not in roles
        assert [e.index for e in driver.events if isinstance(e, Saved)] == list(
            range(1, len(roles) + 1)
        )
        assert len(sim.requests) == len(roles)


async def test_a_halt_lets_calls_in_flight_finish_and_starts_no_more() -> None:
    """After a halt request the calls in flight are journaled and every record halts unfinished."""
    async with started(SimConfig(latency_s=0.2), max_iters=3) as (driver, sim):
        records = tuple(Assignment(record(i)) for i in range(4))
        await driver.exchange(assign=records)
        await anyio.sleep(0.05)  # the four first calls are in flight
        await driver.until(finished(4), halt=True)
        assert len(sim.requests) == 4
    halted = [e for e in driver.events if isinstance(e, Halted)]
    assert len(halted) == 4 and all(h.error is None for h in halted)
    assert len([e for e in driver.events if isinstance(e, Saved)]) == 4


async def test_a_rejected_key_halts_records_with_the_error_that_stops_the_run() -> None:
    """A 401 on a worker halts its record with an AuthError the driver can raise again."""
    async with started(SimConfig(api_key="right"), key="wrong", max_iters=1) as (driver, _):
        await driver.until(finished(1), assign=(Assignment(record()),))
    (halted,) = [e for e in driver.events if isinstance(e, Halted)]
    assert halted.error is not None and isinstance(halted.error.error(), AuthError)
    assert "wrong" not in halted.error.message


async def test_a_request_for_an_earlier_process_is_ignored() -> None:
    """Acks and records meant for an actor's process that died are not taken by its successor."""
    async with started() as (driver, sim):
        stale = Orders("an-earlier-process", acks=(0,), assign=(Assignment(record()),))
        report = await driver.worker.exchange(stale)
        assert report.instance == driver.instance and report.events == ()
        await anyio.sleep(0.1)
        assert sim.requests == []


def test_messages_cross_processes() -> None:
    """A report with every sort of event survives pickling unchanged."""
    step = Step("generate", 0, [{"role": "user", "content": "x"}], "y", None, {}, 0.1, 1)
    outcome = Outcome(record(), "done", "y", 0, 0, "max_iters", None, ())
    report = Report(
        "i",
        1,
        "host",
        (
            Saved(3, "r0", 0, stored_step(step, [])),
            Finished(outcome),
            Halted("r1", WireError("BudgetReached", "m")),
        ),
        reserve=((0, "sim-model", 120, 1024),),
        settled=((0, {"prompt_tokens": 100, "completion_tokens": 7}), (1, None)),
    )
    assert pickle.loads(pickle.dumps(report)) == report


def test_status_shows_the_workers_of_a_live_run() -> None:
    """`refine status` of a running --workers run names each worker's process and restarts."""
    info = {
        "run_dir": "r", "state": "running", "job": "j", "model": "m", "feedback_model": None,
        "input": "9 lines", "shard": None, "bad_lines": 0, "done": 1, "failed": 0,
        "pending": 8, "records": 9, "in_progress": 2, "in_flight": 2, "prompt_tokens": 1,
        "completion_tokens": 1, "calls": 3, "cost_usd": None, "budget_usd": None,
        "live": {
            "calls": 3, "calls_per_s": 1.0, "retries": 0, "rate_limited": 0,
            "workers": [
                {"worker": 0, "pid": 41, "node": "gpu1", "records": 2, "restarts": 1,
                 "alive": True},
                {"worker": 1, "pid": 42, "node": "gpu2", "records": 0, "restarts": 4,
                 "alive": False},
            ],
        },
    }  # fmt: skip
    lines = render_status(info).splitlines()
    assert lines[-1] == (
        "workers:  0: pid 41 on gpu1, 2 records, 1 restarts, "
        "1: pid 42 on gpu2, 0 records, 4 restarts (given up)"
    )


@pytest.mark.anyio
async def test_worker_gate_passes_a_cut_off_retrys_frequency_penalty() -> None:
    """The worker's client wrapper hands every sampling setting on, the penalty included."""
    from types import SimpleNamespace

    from pipeline.backends.ray.worker import _Gate
    from tests.fakes import ScriptedClient

    inner = ScriptedClient(["short answer"])
    gate = _Gate(inner, SimpleNamespace(halting=False))  # type: ignore[arg-type]
    await gate.complete(
        Request(
            ({"role": "user", "content": "q"},),
            temperature=0.0,
            max_tokens=64,
            frequency_penalty=0.5,
        )
    )
    assert inner.penalties == [0.5]


MODE_HOOKS = """
from pipeline.sandbox import current_mode

RUNS_PROGRAMS = True

def check(fields, output):
    return ["mode " + current_mode().value]
"""


@pytest.mark.parametrize("mode", list(SandboxMode))
async def test_a_workers_hooks_run_in_the_runs_sandbox_mode(
    tmp_path: Path, mode: SandboxMode
) -> None:
    """--sandbox reaches the hooks of a worker's records (in the threads they run in)."""
    path = tmp_path / "shout.toml"
    path.write_text(HOOKED_JOB.replace("HOOKS", "mode_hooks.py"))
    (tmp_path / "mode_hooks.py").write_text(MODE_HOOKS)
    job = load_job(str(path))
    with Simulator(SimConfig(latency_s=0.0)) as sim:
        s = resolve(Settings(model="sim-model", base_url=sim.url, max_iters=0, sandbox=mode), 0)
        endpoint = Endpoint("sim-model", ModelId("sim-model"), (sim.url,), "json_schema", None)
        worker = Worker(WorkerSpec(JobFiles.of(job), s, endpoint, None, PriceBook(), False))
        driver = Driver(worker, await worker.start("k"))
        try:
            await driver.until(finished(1), assign=(Assignment(Record("r0", 1, {"text": "hi"})),))
        finally:
            await worker.close()
    steps = [e.step for e in driver.events if isinstance(e, Saved)]
    assert [s["checks"] for s in steps] == [[f"mode {mode.value}"]]
