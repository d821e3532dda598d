"""The Batch API backend (``--batch``): chosen by name, it opens the driver over its endpoints."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio

from ...errors import ConfigError
from ...runs.clients import ClientPlan, Endpoint
from ...runs.session import Session
from ...runs.settings import DEFAULT_TIMEOUT_S, Settings, cache_ttl_of
from .api import BatchAPI, Sides
from .config import BatchConfig
from .driver import BatchDriver
from .opening import OpenedAPI, open_sides

__all__ = ["BatchBackend"]


class BatchBackend:
    """Every call of the run through the Batch API: files and batches, no chat completions.

    ``BatchBackend()`` opens the Batch API at the run's endpoints (``OpenAIBatchAPI``);
    ``BatchBackend(api)`` runs over the API given instead (a test's fake, or one wrapped
    to inject faults), for both sides. ``config`` defaults to ``BatchConfig.from_env()``;
    ``sleep`` and ``clock`` time the polls, refusals and outages (tests pass a fake clock's).
    """

    __slots__ = ("api", "clock", "config", "sleep")

    def __init__(
        self,
        api: BatchAPI | None = None,
        *,
        config: BatchConfig | None = None,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.config = config
        self.sleep = sleep
        self.clock = clock

    @property
    def name(self) -> str:
        return "batch"

    @property
    def opens_clients(self) -> bool:
        return self.api is None

    def check(self, settings: Settings) -> None:
        """Refuse the embedded local model (before it is started): it has no Batch API."""
        if settings.local or settings.critic_is_local:
            raise ConfigError(
                "--batch needs an endpoint with the Batch API (/v1/batches); "
                "the embedded local model has none"
            )

    @contextlib.asynccontextmanager
    async def open(self, session: Session, plan: ClientPlan) -> AsyncIterator[BatchDriver]:
        """The driver over the API given, or the Batch API opened at the plan's endpoints."""
        critic = plan.critic
        opened: list[OpenedAPI] = []
        if self.api is not None:
            sides = Sides.over(
                self.api,
                str(plan.generator.model_id),
                None if critic is None else str(critic.model_id),
            )
        else:
            timeout = session.settings.timeout or DEFAULT_TIMEOUT_S
            sides, opened = open_sides(
                plan.api_key,
                timeout,
                _side(plan.generator),
                None if critic is None else _side(critic),
                cache_ttl_of(session.settings),
            )
        try:
            config = self.config or BatchConfig.from_env()
            driver = BatchDriver(
                session, sides, config, opened=opened, sleep=self.sleep, clock=self.clock
            )
            try:
                yield driver
            finally:
                driver.ledger.close()
        finally:
            with anyio.CancelScope(shield=True):
                for api in opened:
                    await api.aclose()


def _side(endpoint: Endpoint) -> tuple[str, str | None]:
    """(model id, base URL) of one side: its first endpoint, or its provider's own."""
    return str(endpoint.model_id), endpoint.urls[0] if endpoint.urls else None
