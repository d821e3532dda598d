"""Where each side of the loop is served, and opening a client there.

``Endpoint`` says where the generator (or the critic) is served; ``ClientPlan`` is both
sides and the key, what a backend opens its clients from (in this process, or a Ray
worker's); ``open_client`` opens the client of the endpoint's provider (``DIALECTS``: an
OpenAI-compatible endpoint's ``OpenAIClient``, Anthropic's ``AnthropicClient``) on one
endpoint under the run's settings, budget and limiter. This is the one place a provider is
chosen: above it every side is a ``ChatClient``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..client.budget import Spending
from ..client.context import context_window
from ..client.limits import Limiter, RateLimiter
from ..client.models import ModelId, Provider
from .settings import Settings, cache_ttl_of

if TYPE_CHECKING:
    from ..client.calls import ChatClient

__all__ = ["DIALECTS", "ClientPlan", "Endpoint", "open_client"]


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
    """Where the run's clients go, generator and critic, and the key to open them with."""

    generator: Endpoint
    critic: Endpoint | None
    api_key: str | None = field(repr=False)  # travels by call argument, never in a repr or log


# Each dialect is imported when a client of it opens: it brings the HTTP SDK, which a command
# that calls no model never needs.


def _openai(settings: Settings, endpoint: Endpoint, options: dict[str, Any]) -> ChatClient[Any]:
    from ..client.chat import OpenAIClient

    # The embedded model has no tiers: its calls are free and it is not asked for one.
    tier = None if endpoint.model_id.is_local else settings.service_tier
    return OpenAIClient(service_tier=tier, **options)


def _anthropic(settings: Settings, endpoint: Endpoint, options: dict[str, Any]) -> ChatClient[Any]:
    from ..client.anthropic import AnthropicClient

    return AnthropicClient(cache_ttl=cache_ttl_of(settings), **options)


# Each provider's client, opened from the run's settings, the endpoint and the options every
# client takes.
DIALECTS: dict[Provider, Callable[[Settings, Endpoint, dict[str, Any]], ChatClient[Any]]] = {
    Provider.ENDPOINT: _openai,
    Provider.LOCAL: _openai,
    Provider.ANTHROPIC: _anthropic,
}


def open_client(
    endpoint: Endpoint,
    settings: Settings,
    api_key: str | None,
    budget: Spending,
    limiter: RateLimiter | None = None,
) -> ChatClient[Any]:
    """The client of ``endpoint``'s provider, under the run's settings, budget and limiter."""
    options: dict[str, Any] = {
        "model": str(endpoint.model_id),
        "request_model": endpoint.model,
        "base_url": endpoint.urls or None,
        "api_key": api_key,
        "timeout": settings.timeout or 0.0,
        "max_retries": settings.max_retries,
        "limiter": limiter or Limiter(settings.rpm, settings.tpm),
        "concurrency": settings.concurrency,
        "structured": endpoint.structured,
        "grammar": endpoint.grammar,
        "max_in_flight": endpoint.slots,
        "max_outage": settings.max_outage,
        "budget": budget,
        "context_tokens": endpoint.window(settings),
    }
    return DIALECTS[endpoint.model_id.provider](settings, endpoint, options)
