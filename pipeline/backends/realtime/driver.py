"""The real-time backend: up to ``--concurrency`` records in flight through the pool.

Each record is ``core.loop.refine_record`` over the run's model clients: the generator's
and, when the critic is another model, the critic's. ``RealTimeBackend()`` opens them on
the run's endpoints; ``RealTimeBackend(client, critic)`` runs over clients given instead
(any ``ModelClient``: tests' fakes, an embedding program's own).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
from anyio.abc import ObjectSendStream

from ...client.calls import ChatClient
from ...core.loop import refine_record
from ...core.records import Record
from ...core.steps import ModelClient
from ...errors import BudgetReached, FatalCallError, StoreError
from ...runs.clients import ClientPlan, open_client
from ...runs.session import CallCounts, Halt, Session, halt_of
from ...runs.settings import Settings
from .pool import run_pool

__all__ = ["RealTimeBackend", "RealTimeDriver"]


class RealTimeBackend:
    """The default backend: every call made as the loop asks for it."""

    __slots__ = ("client", "critic")

    def __init__(
        self, client: ModelClient | None = None, critic: ModelClient | None = None
    ) -> None:
        self.client = client  # None: a client opened on the generator's endpoint
        self.critic = critic  # None: opened on the critic's endpoint, when it has one

    @property
    def name(self) -> str:
        return "realtime"

    @property
    def opens_clients(self) -> bool:
        return self.client is None

    def check(self, settings: Settings) -> None:
        """Nothing to refuse: real time serves every setting ``runs.settings`` accepts."""

    @contextlib.asynccontextmanager
    async def open(self, session: Session, plan: ClientPlan) -> AsyncIterator[RealTimeDriver]:
        """The driver over the clients given, or opened on the plan's endpoints."""
        settings, budget = session.settings, session.budget
        owned: list[ChatClient[Any]] = []
        try:
            generator = self.client
            if generator is None:
                generator = open_client(plan.generator, settings, plan.api_key, budget)
                owned.append(generator)
            critic = self.critic
            if critic is None and plan.critic is not None:
                if plan.critic is plan.generator and self.client is None:
                    critic = generator
                else:
                    critic = open_client(plan.critic, settings, plan.api_key, budget)
                    owned.append(critic)
            yield RealTimeDriver(session, generator, critic, owned)
        finally:
            with anyio.CancelScope(shield=True):
                for c in owned:
                    await c.aclose()


class RealTimeDriver:
    """Up to ``--concurrency`` records in flight, each its loop over the clients."""

    __slots__ = ("critic", "generator", "owned", "session")

    def __init__(
        self,
        session: Session,
        generator: ModelClient,
        critic: ModelClient | None,
        owned: Sequence[ChatClient[Any]],
    ) -> None:
        self.session = session
        self.generator = generator
        self.critic = critic
        self.owned = owned  # the clients the backend opened: reached, counted and closed

    async def preflight(self) -> None:
        """Raise UnreachableError when an endpoint of a client it opened cannot be reached."""
        for c in self.owned:
            await c.preflight()

    def counts(self) -> CallCounts:
        """Calls, retries and 429s of the clients the backend opened."""
        return CallCounts(
            sum(c.calls for c in self.owned),
            sum(c.retries for c in self.owned),
            sum(c.limiter.rate_limited for c in self.owned),
        )

    async def run(self) -> None:
        """Run the session's records through the pool."""
        session = self.session

        async def produce(send: ObjectSendStream[Record]) -> None:
            await session.records(send.send)

        async def work(record: Record) -> None:
            session.counters.in_flight += 1
            try:
                outcome = await refine_record(
                    record,
                    session.job,
                    self.generator,
                    session.sink(),
                    session.policy,
                    critic=self.critic,
                    prior=session.take_prior(record.id),
                )
            except BudgetReached as err:
                session.halting.set(Halt.BUDGET, err)  # the record stays pending
                return
            finally:
                session.counters.in_flight -= 1
            session.finish(outcome)

        try:
            await run_pool(produce, work, session.settings.concurrency)
        except* (FatalCallError, StoreError) as group:
            err = group.exceptions[0]
            session.halting.set(halt_of(err), err)
