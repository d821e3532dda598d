"""A Ray worker: runs the loops of the records the driver gives it, and reports every step.

Each worker process opens its own model clients (clients cannot be pickled) from the run's
endpoints and settings, with a ``RemoteLimiter`` in place of the local pacer and, under
``--budget``, a ``RemoteBudget`` that reserves against the driver's. A record's loop is the same
``refine_record`` a single process runs; its sink sends each step to the driver and waits
for the acknowledgement that it is journaled, so a crash of either process repeats at
most the calls that were in flight. Everything is set up on ``start`` (the async methods
run on the actor's event loop); the API key arrives there too, as an argument: in Ray's
runtime_env it would be written to the cluster's logs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ...client.budget import Budget, Spending
from ...client.calls import ChatClient
from ...client.prices import PriceBook
from ...core.jobs import Job
from ...core.loop import Policy, refine_record
from ...core.steps import Completion, ModelClient, Request, Step
from ...core.trace import stored_step
from ...errors import BudgetReached, FatalCallError
from ...runs.clients import Endpoint, open_client
from ...runs.settings import Settings, effective_job
from ...sandbox import require_isolation, use_mode
from .jobfiles import JobFiles
from .messages import (
    Assignment,
    Crashed,
    Event,
    Finished,
    Halted,
    Orders,
    Report,
    Saved,
    WireError,
)
from .pacing import RemoteLimiter
from .spending import RemoteBudget

__all__ = ["Worker", "WorkerSpec"]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What every worker of a run is built from (no secrets: Ray keeps it to restart workers)."""

    job: JobFiles
    settings: Settings
    generator: Endpoint
    critic: Endpoint | None
    prices: PriceBook
    budgeted: bool  # the run has a --budget: every request reserves against the driver's


class _Halted(Exception):
    """The run is halting: a loop starts no further call (it never leaves this module)."""


class _Gate:
    """A model client that refuses to start a call once the run is halting."""

    __slots__ = ("_client", "_session")

    def __init__(self, client: ModelClient, session: _Session) -> None:
        self._client = client
        self._session = session

    @property
    def model(self) -> str:
        return self._client.model

    async def complete(self, request: Request) -> Completion:
        if self._session.halting:
            raise _Halted
        return await self._client.complete(request)


class _AckSink:
    """Sends each step to the driver and returns once the driver has journaled it."""

    __slots__ = ("_session",)

    def __init__(self, session: _Session) -> None:
        self._session = session

    async def save(self, record_id: str, earlier: Sequence[Step], step: Step) -> None:
        s = self._session
        seq = next(s.seqs)
        journaled = anyio.Event()
        s.unacked[seq] = journaled
        s.emit(Saved(seq, record_id, len(earlier), stored_step(step, earlier)))
        await journaled.wait()
        s.known[record_id] += 1


class _Session:
    """A started worker: its clients, the records it runs, and what it has to tell the driver."""

    def __init__(self, spec: WorkerSpec, job: Job, api_key: str | None) -> None:
        s = spec.settings
        self.job = effective_job(job, s)
        self.sandbox = s.sandbox
        self.policy = Policy(s.max_iters or 0, s.min_iters, s.checks)
        self.halting = False  # the driver said halt: loops start no further call
        self.outbox: list[Event] = []
        self.unacked: dict[int, anyio.Event] = {}
        self.known: dict[str, int] = {}  # per record: steps the driver has journaled
        self.seqs = itertools.count()
        self.active = 0  # records given and not yet reported back
        self._changed = anyio.Event()
        # Without --budget a local Budget only notes unpriced calls; the driver adds up.
        self.remote_budget = RemoteBudget(self.wake) if spec.budgeted else None
        budget: Spending = self.remote_budget or Budget(None, spec.prices)
        limited = bool(s.rpm or s.tpm)
        self.limiters = [RemoteLimiter(limited, self.wake)]
        self.clients = [open_client(spec.generator, s, api_key, budget, self.limiters[0])]
        critic: ChatClient[Any] | None = None
        if spec.critic is not None:
            self.limiters.append(RemoteLimiter(limited, self.wake))
            critic = open_client(spec.critic, s, api_key, budget, self.limiters[1])
            self.clients.append(critic)
        self.generator = _Gate(self.clients[0], self)
        self.critic = None if critic is None else _Gate(critic, self)
        self.task_group: TaskGroup | None = None

    def wake(self) -> None:
        """Something new to tell the driver: end a waiting exchange."""
        self._changed.set()

    def emit(self, event: Event) -> None:
        """Queue an event for the next report."""
        self.outbox.append(event)
        self.wake()

    async def serve(self, started: anyio.Event) -> None:
        """Hold the task group the records run in, until the process ends."""
        async with anyio.create_task_group() as tg:
            self.task_group = tg
            started.set()
            await anyio.sleep_forever()

    async def run(self, a: Assignment) -> None:
        """Run one record's loop and report how it ended."""
        rid = a.record.id
        self.known[rid] = len(a.prior)
        try:
            with use_mode(self.sandbox):  # this record's task, and the threads its hooks run in
                outcome = await refine_record(
                    a.record,
                    self.job,
                    self.generator,
                    _AckSink(self),
                    self.policy,
                    critic=self.critic,
                    prior=a.prior,
                )
        except (FatalCallError, BudgetReached) as err:
            self.emit(Halted(rid, WireError.of(err)))
        except _Halted:
            self.emit(Halted(rid))
        except Exception:
            self.emit(Crashed(rid, traceback.format_exc()))
        else:
            journaled = self.known[rid]
            self.emit(Finished(replace(outcome, steps=outcome.steps[journaled:])))
        finally:
            self.active -= 1
            del self.known[rid]

    def has_news(self) -> bool:
        """Whether the next report has something to say."""
        budget = self.remote_budget
        return bool(
            self.outbox
            or (budget is not None and budget.waiting)
            or any(lim.waiting for lim in self.limiters)
        )

    async def wait(self, poll_s: float) -> None:
        """Wait for news up to ``poll_s`` seconds, while records are running."""
        if self.has_news() or not (self.active or self.unacked):
            return
        with anyio.move_on_after(poll_s):
            while not self.has_news():
                await self._changed.wait()
                self._changed = anyio.Event()

    def stats(self) -> tuple[int, int, int]:
        """Calls, retries and 429s of this worker's clients."""
        return (
            sum(c.calls for c in self.clients),
            sum(c.retries for c in self.clients),
            sum(lim.rate_limited for lim in self.limiters),
        )


class Worker:
    """The Ray actor (the driver wraps it with ``ray.remote``): ``start``, then ``exchange``."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.instance = uuid.uuid4().hex  # a restarted actor is another instance
        self.node = socket.gethostname()
        self._session: _Session | None = None
        self._serving: asyncio.Task[None] | None = None

    async def start(self, api_key: str | None) -> str:
        """Load the job, open the clients; return this process's instance id."""
        if self._session is None:
            job = await anyio.to_thread.run_sync(self.spec.job.load)
            if job.runs_programs:  # this node confines them as the driver's did, or refuses
                await anyio.to_thread.run_sync(require_isolation, self.spec.settings.sandbox)
            session = _Session(self.spec, job, api_key)
            started = anyio.Event()
            # The records' task group lives in a task of its own: an exchange returns at once.
            self._serving = asyncio.get_running_loop().create_task(session.serve(started))
            await started.wait()
            self._session = session
        return self.instance

    async def close(self) -> None:
        """Cancel the records still running and close the clients (the driver kills the process)."""
        session, serving = self._session, self._serving
        if session is None or serving is None or session.task_group is None:
            return
        session.task_group.cancel_scope.cancel()
        try:
            await serving
        finally:
            for client in session.clients:
                await client.aclose()

    async def exchange(self, req: Orders) -> Report:
        """Take the driver's news, wait a little for ours, and return it."""
        s = self._session
        if s is None or req.instance != self.instance:
            # Meant for an earlier process of this actor: its acks and records mean nothing here.
            return Report(self.instance, os.getpid(), self.node)
        for seq in req.acks:
            journaled = s.unacked.pop(seq, None)
            if journaled is not None:
                journaled.set()
        for limiter, waits in zip(s.limiters, req.waits, strict=False):
            limiter.grant(waits)
        if s.remote_budget is not None:
            s.remote_budget.decided(req.reserved)
        if req.halt:
            s.halting = True
        assert s.task_group is not None
        for a in req.assign:
            s.active += 1
            s.task_group.start_soon(s.run, a)
        await s.wait(req.poll_s)
        events, s.outbox = tuple(s.outbox), []
        reserve, settled = s.remote_budget.take() if s.remote_budget is not None else ((), ())
        calls, retries, limited = s.stats()
        return Report(
            self.instance,
            os.getpid(),
            self.node,
            events,
            tuple(lim.take() for lim in s.limiters),
            reserve,
            settled,
            calls,
            retries,
            limited,
        )
