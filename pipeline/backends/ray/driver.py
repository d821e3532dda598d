"""The Ray driver: the ``refine`` process hands records to worker actors and journals their steps.

The driver keeps what a single process keeps, the reader, the checkpoint journal and the
output files, so no filesystem is shared and resume is unchanged. Each worker runs up to
``--concurrency`` records; the driver keeps one ``exchange`` call in flight per worker
(see ``messages``): it journals the steps a report brings, acknowledges them in the next
orders, writes finished records, refills the worker, and answers its asks for time slots
(``pacing``) and budget reservations (``spending``).

A worker process that dies (``RayActorError``) loses only its calls in flight: its records
go back to the queue with every step the driver journaled for them and run on the next
worker with room, while Ray restarts the process (up to MAX_RESTARTS times). An error that
halts the run (401, unknown model, outage, budget) stops every worker from starting new
calls; their calls in flight finish and are journaled, and the run exits with the status a
single process would. A driver that dies leaves a journal like a single process does.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

import anyio
import openai
from anyio.abc import TaskGroup

from ...client.limits import Limiter
from ...client.prices import at_batch_rate
from ...client.reach import PREFLIGHT_S, preflight
from ...core.records import Record
from ...core.steps import Step
from ...core.trace import step_of
from ...errors import BudgetReached, ConfigError, StoreError, UnavailableError
from ...runs.clients import ClientPlan
from ...runs.session import CallCounts, Halt, Session, halt_of
from .connect import connect
from .jobfiles import JobFiles
from .messages import Assignment, Crashed, Finished, Halted, Orders, Report, Saved
from .pacing import grant
from .spending import Accounts, reached
from .worker import Worker, WorkerSpec

__all__ = ["MAX_RESTARTS", "WORKER_CPUS", "RayDriver"]

log = logging.getLogger("refine")

MAX_RESTARTS = 3  # times Ray restarts a worker process that died before it is given up
# While Ray restarts a worker, calls to it fail as unavailable: try again this often, this long.
START_RETRY_S = 0.5
START_PATIENCE_S = 120.0
WORKER_CPUS = 1  # CPUs Ray reserves for a worker: its loops and HTTP client use one core


@dataclass(slots=True)
class _Running:
    """A record a worker runs, with every step the driver has journaled for it."""

    record: Record
    steps: list[Step]


class _Dispatch:
    """Records waiting for a worker: those of a worker that died first, then fresh input."""

    def __init__(self, session: Session, buffer: int) -> None:
        self.session = session
        self._send, self._fresh = anyio.create_memory_object_stream[Record](buffer)
        self.returned: deque[Assignment] = deque()
        self.input_done = False
        self.in_flight = 0  # records given to workers and not reported back
        self._changed = anyio.Event()

    async def produce(self) -> None:
        """Read the input into the queue (the reader skips finished records and other shards)."""

        async def put(record: Record) -> None:
            await self._send.send(record)
            self.changed()

        try:
            async with self._send:
                await self.session.records(put)
        finally:
            self.input_done = True
            self.changed()

    def take(self, n: int) -> list[Assignment]:
        """Up to ``n`` records to give a worker now."""
        out: list[Assignment] = []
        while len(out) < n and self.returned:
            out.append(self.returned.popleft())
        while len(out) < n:
            try:
                record = self._fresh.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
            prior = tuple(self.session.take_prior(record.id))
            out.append(Assignment(record, prior))
        self.in_flight += len(out)
        return out

    def give_back(self, assignments: list[Assignment]) -> None:
        """Records a dead worker held: they go first to the next worker with room."""
        self.returned.extend(assignments)
        self.in_flight -= len(assignments)
        self.changed()

    def done_with(self, count: int = 1) -> None:
        """Records reported back (finished or halted)."""
        self.in_flight -= count
        self.changed()

    @property
    def finished(self) -> bool:
        """Whether every record of the input has been run."""
        buffered = self._fresh.statistics().current_buffer_used
        return self.input_done and not self.returned and not buffered and self.in_flight == 0

    def close(self) -> None:
        """Drop what is left in the queue (the run is over)."""
        self._send.close()
        self._fresh.close()

    def changed(self) -> None:
        """Wake the links waiting for work."""
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def wait(self) -> None:
        """Wait until records arrive, come back, or the run ends."""
        await self._changed.wait()


class _Run:
    """What the links of a run share: the session, the queue, the limiters and the budget."""

    def __init__(self, session: Session, sides: int, api_key: str | None) -> None:
        s = session.settings
        self.session = session
        self.api_key = api_key
        self.concurrency = s.concurrency
        workers = s.workers or 1
        self.dispatch = _Dispatch(session, workers * s.concurrency)
        # One pacer per model, as a single process has one per client.
        self.limiters = [Limiter(s.rpm, s.tpm) for _ in range(sides)]
        self.budgeted = s.budget is not None
        self.tasks: TaskGroup | None = None  # for tasks that outlive one exchange
        self.aborted = False  # the journal cannot be written: leave at once
        self.links: list[_Link] = []
        self.counts = CallCounts()  # the workers' clients', every process of each

    def start_task(self, func: Callable[..., Coroutine[Any, Any, None]], *args: object) -> None:
        """Start a task that may outlive the exchange that asked for it."""
        assert self.tasks is not None
        self.tasks.start_soon(func, *args)

    async def produce(self) -> None:
        """Read the input into the queue; a full disk (errors.jsonl) stops the run."""
        try:
            await self.dispatch.produce()
        except StoreError as err:
            self.halt(Halt.STORE, err)

    def halt(self, reason: Halt, err: BaseException) -> None:
        """Halt the run: workers start no new call (after a journal error, links leave at once)."""
        self.session.halting.set(reason, err)
        if reason is Halt.STORE:
            self.aborted = True
        self.dispatch.changed()

    def publish(self) -> None:
        """The workers' figures, for progress and ``refine status``."""
        totals = [0, 0, 0]
        for link in self.links:
            for i, value in enumerate(link.totals()):
                totals[i] += value
        self.counts = CallCounts(totals[0], totals[1], totals[2])
        self.session.counters.in_flight = self.dispatch.in_flight
        self.session.live["workers"] = [link.describe() for link in self.links]


class _Link:
    """The driver's side of one worker: the records it runs, and the exchange loop."""

    def __init__(self, index: int, handle: Any, run: _Run) -> None:
        self.index = index
        self.handle = handle
        self.run = run
        self.instance: str | None = None
        self.running: dict[str, _Running] = {}
        self.acks: list[int] = []
        self.waits: tuple[tuple[float, ...], ...] = ()
        batch = at_batch_rate(None, run.session.settings.service_tier)  # flex: the batch rate
        self.accounts = Accounts(
            run.session.budget, run.start_task, run.dispatch.changed, batch=batch
        )
        self.deaths = 0
        self.gone = False
        self.pid: int | None = None
        self.node: str | None = None
        self.stats = (0, 0, 0)  # of the current process
        self.earlier = (0, 0, 0)  # of the processes that died

    def totals(self) -> tuple[int, int, int]:
        """Calls, retries and 429s of every process of this worker."""
        a, b = self.stats, self.earlier
        return (a[0] + b[0], a[1] + b[1], a[2] + b[2])

    def describe(self) -> dict[str, Any]:
        """This worker, for progress.json."""
        return {
            "worker": self.index,
            "pid": self.pid,
            "node": self.node,
            "records": len(self.running),
            "restarts": self.deaths,
            "alive": not self.gone,
        }

    async def serve(self) -> None:
        """Exchange with the worker until the run is over for it."""
        import ray

        run, session = self.run, self.run.session
        while not self.gone and not run.aborted:
            halting = session.halting.requested
            if halting and not self.running:
                return
            if not halting and run.dispatch.finished:
                return
            if self.instance is None:
                await self._start()
                continue
            free = run.concurrency - len(self.running)
            assign = [] if halting else run.dispatch.take(free)
            owed = self.acks or any(self.waits) or self.accounts.decisions
            if not assign and not self.running and not owed:
                await run.dispatch.wait()
                continue
            for a in assign:
                self.running[a.record.id] = _Running(a.record, list(a.prior))
            orders = Orders(
                self.instance,
                tuple(self.acks),
                tuple(assign),
                self.waits,
                self.accounts.take(),
                halt=halting,
            )
            self.acks, self.waits = [], ()
            try:
                report: Report = await self.handle.exchange.remote(orders)
            except ray.exceptions.RayActorError as err:
                self._lost(_first_line(err))
                continue
            if report.instance != self.instance:
                self._lost("its process was restarted")
                continue
            await self._absorb(report)
            run.publish()

    async def _start(self) -> None:
        import ray

        # Older Ray queues calls to a restarting actor; newer Ray refuses them for a while.
        restarting = getattr(ray.exceptions, "ActorUnavailableError", ())
        started = time.monotonic()
        try:
            while True:
                try:
                    self.instance = await self.handle.start.remote(self.run.api_key)
                    return
                except restarting:
                    if time.monotonic() - started > START_PATIENCE_S:
                        raise
                    await anyio.sleep(START_RETRY_S)
        except ray.exceptions.RayActorError as err:
            self.gone = True
            log.warning("Ray worker %d cannot be started: %s", self.index, _first_line(err))
        except ray.exceptions.RayTaskError as err:
            # The worker's machine cannot load the job (another version, a missing module).
            self.gone = True
            cause = err.cause if err.cause is not None else err
            failed = ConfigError(f"Ray worker {self.index} cannot start: {cause}")
            self.run.halt(Halt.FATAL, failed)

    def _lost(self, why: str) -> None:
        """The worker process died: its records go back to the queue with their steps."""
        self.deaths += 1
        back = [Assignment(r.record, tuple(r.steps)) for r in self.running.values()]
        log.warning(
            "Ray worker %d (pid %s) is gone (%s); its %d record(s) continue on other workers "
            "from their last journaled call",
            self.index,
            self.pid,
            why,
            len(back),
        )
        self.running.clear()
        self.run.dispatch.give_back(back)
        self.instance = None
        self.acks, self.waits = [], ()
        self.accounts.lost()
        self.earlier = self.totals()
        self.stats = (0, 0, 0)
        if self.deaths > MAX_RESTARTS:
            self.gone = True
            log.warning("Ray worker %d died %d times: given up", self.index, self.deaths)
        self.run.publish()

    async def _absorb(self, report: Report) -> None:
        """Journal the report's steps, write its finished records, answer its asks."""
        run, session = self.run, self.run.session
        self.pid, self.node = report.pid, report.node
        self.stats = (report.calls, report.retries, report.rate_limited)
        saves = [e for e in report.events if isinstance(e, Saved)]
        if saves and not await self._journal(saves):
            return
        for event in report.events:
            if isinstance(event, Finished):
                running = self.running.pop(event.outcome.record.id)
                steps = (*running.steps, *event.outcome.steps)
                try:
                    session.finish(replace(event.outcome, steps=steps))
                except StoreError as err:
                    run.halt(Halt.STORE, err)
                    return
                run.dispatch.done_with()
            elif isinstance(event, Halted):
                del self.running[event.record_id]
                run.dispatch.done_with()
                if event.error is not None:
                    failure = event.error.error()
                    if isinstance(failure, BudgetReached):
                        failure = reached(session.budget)
                    run.halt(halt_of(failure), failure)
            elif isinstance(event, Crashed):
                raise RuntimeError(
                    f"Ray worker {self.index} failed on record {event.record_id}:\n{event.text}"
                )
        self.waits = tuple(
            grant(limiter, ask) for limiter, ask in zip(run.limiters, report.pace, strict=False)
        )
        self.accounts.settle(report.settled)
        self.accounts.ask(report.reserve)

    async def _journal(self, saves: list[Saved]) -> bool:
        """Journal the steps (one group commit) and charge them; False when that failed."""
        session = self.run.session
        sink = session.sink()
        steps: list[Step] = []
        failed: StoreError | None = None
        try:
            async with anyio.create_task_group() as tg:
                for e in saves:
                    running = self.running[e.record_id]
                    if e.index != len(running.steps):
                        raise RuntimeError(
                            f"record {e.record_id}: step {e.index} arrived after "
                            f"{len(running.steps)} steps"
                        )
                    earlier = running.steps[:]
                    step = step_of(e.step, earlier)
                    running.steps.append(step)
                    steps.append(step)
                    tg.start_soon(sink.save, e.record_id, earlier, step)
        except* StoreError as group:
            failed = group.exceptions[0]  # type: ignore[assignment]
        if failed is not None:
            self.run.halt(Halt.STORE, failed)
            return False
        if not self.run.budgeted:  # under --budget the settlements add up instead
            for step in steps:
                model = step.model or session.model_for[step.role]
                session.budget.charge(model, step.usage)
        self.acks.extend(e.seq for e in saves)
        return True


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class RayDriver:
    """The run's records on ``--workers`` Ray actors, each opening its clients by the plan."""

    def __init__(self, session: Session, plan: ClientPlan) -> None:
        self.session = session
        self.plan = plan
        self._run: _Run | None = None  # made when it runs

    async def preflight(self) -> None:
        """Raise UnreachableError when an endpoint the workers will call cannot be reached
        (asked from here, before any worker starts)."""
        sides = [self.plan.generator, *([] if self.plan.critic is None else [self.plan.critic])]
        urls: list[str | None] = [url for side in sides for url in side.urls or [None]]
        conns = [
            openai.AsyncOpenAI(api_key=self.plan.api_key or "no-key", base_url=url, max_retries=0)
            for url in urls
        ]
        try:
            await preflight(conns, min(self.session.settings.timeout or PREFLIGHT_S, PREFLIGHT_S))
        finally:
            with anyio.CancelScope(shield=True):
                for conn in conns:
                    await conn.close()

    def counts(self) -> CallCounts:
        """Calls, retries and 429s of the workers' clients, as their last reports said."""
        return CallCounts() if self._run is None else self._run.counts

    async def run(self) -> None:
        """Start the workers, feed them the session's records, journal what they report."""
        import ray

        session, plan = self.session, self.plan
        run = self._run = _Run(session, 1 if plan.critic is None else 2, plan.api_key)
        s = session.settings
        workers = s.workers or 1
        spec = WorkerSpec(
            JobFiles.of(session.job),
            s,
            plan.generator,
            plan.critic,
            session.prices,
            s.budget is not None,
        )
        async with connect(s, workers):
            actor = ray.remote(Worker).options(
                num_cpus=WORKER_CPUS,
                max_restarts=MAX_RESTARTS,
                max_task_retries=0,
                scheduling_strategy="SPREAD",
            )
            handles: list[Any] = [actor.remote(spec) for _ in range(workers)]
            run.links = [_Link(i, h, run) for i, h in enumerate(handles)]
            try:
                async with anyio.create_task_group() as tg:
                    run.tasks = tg
                    tg.start_soon(run.produce)
                    async with anyio.create_task_group() as links:
                        for link in run.links:
                            links.start_soon(link.serve)
                    tg.cancel_scope.cancel()  # the reader may be waiting for room in the queue
                if not run.dispatch.finished and not session.halting.requested:
                    run.halt(
                        Halt.UNAVAILABLE,
                        UnavailableError(
                            "workers",
                            "no Ray worker is left (each died or could not start; see the "
                            "warnings above); stopped, resumable",
                        ),
                    )
            finally:
                run.dispatch.close()
                for handle in handles:
                    ray.kill(handle, no_restart=True)
                run.publish()
