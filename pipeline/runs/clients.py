"""The run's model clients: where each side of the loop is served, and opening clients there.

``Endpoint`` says where the generator (or the critic) is served; ``open_client`` opens an
``OpenAIClient`` on one under the run's settings, budget and limiter (a Ray worker opens
its own from a ``ClientPlan``); ``Models`` holds the clients a run opened.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from ..client.budget import Spending
from ..client.chat import OpenAIClient
from ..client.context import context_window
from ..client.limits import Limiter, RateLimiter
from ..client.models import ModelId
from ..core.steps import ModelClient
from .settings import Settings

__all__ = ["BatchSide", "ClientPlan", "Endpoint", "Models", "open_client"]


class BatchSide(Protocol):
    """The Batch API clients of a ``--batch`` run, as the run sees them."""

    def stats(self) -> tuple[int, int, int]:
        """Lines sent, retried, and refused for a rate limit."""
        ...

    async def aclose(self) -> None:
        """Close the connections."""
        ...


class Models:
    """The run's model clients: the generator's and, when it is another model, the critic's.

    With ``--batch`` the calls go through ``batch`` (the Batch API endpoints) instead; on
    Ray (``--workers``) each worker opens its own clients from ``plan``, and their figures
    arrive in ``remote``.
    """

    __slots__ = ("batch", "critic", "generator", "owned", "plan", "remote")

    def __init__(
        self,
        generator: ModelClient,
        critic: ModelClient | None = None,
        owned: tuple[OpenAIClient, ...] = (),
        batch: BatchSide | None = None,
    ) -> None:
        self.generator = generator
        self.critic = critic
        self.owned = owned  # the clients this run opened (and closes)
        self.batch = batch  # closed with the others
        self.plan: ClientPlan | None = None
        self.remote = (0, 0, 0)  # calls, retries and 429s of clients in other processes (Ray)

    def stats(self) -> tuple[int, int, int]:
        """Calls, retries and 429s of the clients this run opened (batch lines count as calls),
        here and on Ray workers."""
        calls, retries, limited = self.batch.stats() if self.batch is not None else self.remote
        return (
            calls + sum(c.calls for c in self.owned),
            retries + sum(c.retries for c in self.owned),
            limited + sum(c.limiter.rate_limited for c in self.owned),
        )

    async def preflight(self) -> None:
        """Raise UnreachableError when an endpoint of a client this run opened cannot be
        reached (a free request to each, before the first call)."""
        for c in self.owned:
            await c.preflight()

    async def aclose(self) -> None:
        """Close the HTTP connections of the clients this run opened."""
        with anyio.CancelScope(shield=True):
            for c in self.owned:
                await c.aclose()
            if self.batch is not None:
                await self.batch.aclose()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one side of the loop (generator or critic) is served."""

    model: str  # the name sent in requests
    model_id: ModelId  # the model as the run records it (``local:NAME``: the embedded one)
    urls: tuple[str, ...]
    structured: str
    slots: int | None  # requests the server computes at once (a local server), else None
    provenance: dict[str, Any] | None = None  # a local model's file, SHA-256 and origin
    grammar: bool = False  # a grammar enforces the schema, unseen by the model (a local server)
    context: int | None = None  # tokens a call may hold, where the server says (a local slot)

    def window(self, settings: Settings) -> int | None:
        """The context window a call to this side must fit: --context-tokens, else the
        server's, else the known model's (None: unknown, nothing refused)."""
        return settings.context_tokens or self.context or context_window(str(self.model_id))


@dataclass(frozen=True, slots=True)
class ClientPlan:
    """How to open the run's clients in another process (a Ray worker)."""

    generator: Endpoint
    critic: Endpoint | None
    api_key: str | None = field(repr=False)  # travels by call argument, never in a repr or log


def open_client(
    endpoint: Endpoint,
    settings: Settings,
    api_key: str | None,
    budget: Spending,
    limiter: RateLimiter | None = None,
) -> OpenAIClient:
    return OpenAIClient(
        model=str(endpoint.model_id),
        request_model=endpoint.model,
        base_url=endpoint.urls or None,
        api_key=api_key,
        timeout=settings.timeout or 0.0,
        max_retries=settings.max_retries,
        limiter=limiter or Limiter(settings.rpm, settings.tpm),
        concurrency=settings.concurrency,
        structured=endpoint.structured,
        grammar=endpoint.grammar,
        max_in_flight=endpoint.slots,
        max_outage=settings.max_outage,
        budget=budget,
        # The embedded model has no tiers: its calls are free and it is not asked for one.
        service_tier=None if endpoint.model_id.is_local else settings.service_tier,
        context_tokens=endpoint.window(settings),
    )
