"""Opening a run's batch endpoints: the provider's batch API for each side's model.

``BATCH_APIS`` is the one place a batch API is chosen by provider: OpenAI's Batch API
(``api.OpenAIBatchAPI``) for an OpenAI-compatible endpoint, Message Batches
(``anthropic.AnthropicBatchAPI``) for ``anthropic:`` models. Above it the driver sees
``BatchAPI`` only.
"""

from __future__ import annotations

from collections.abc import Callable

from ...client.models import ModelId, Provider
from .anthropic import AnthropicBatchAPI
from .api import OpenAIBatchAPI, Side, Sides

__all__ = ["BATCH_APIS", "OpenedAPI", "open_sides"]

OpenedAPI = OpenAIBatchAPI | AnthropicBatchAPI  # an endpoint a backend opened (and closes)


def _openai(url: str | None, key: str | None, timeout: float, ttl: str | None) -> OpenedAPI:
    return OpenAIBatchAPI(url, key, timeout)


# Each provider's batch API, from (base URL, key, timeout, the cache TTL its calls mark).
BATCH_APIS: dict[Provider, Callable[[str | None, str | None, float, str | None], OpenedAPI]] = {
    Provider.ENDPOINT: _openai,
    Provider.ANTHROPIC: AnthropicBatchAPI,
}


def open_sides(
    api_key: str | None,
    timeout: float,
    generator: tuple[str, str | None],
    critic: tuple[str, str | None] | None = None,
    cache_ttl: str | None = None,
) -> tuple[Sides, list[OpenedAPI]]:
    """The batch endpoints of (model id, base URL) of the generator and the critic; the
    endpoints opened, each once (the critic's is the generator's at the same URL)."""

    def make(model: str, url: str | None) -> OpenedAPI:
        return BATCH_APIS[ModelId.parse(model).provider](url, api_key, timeout, cache_ttl)

    gen_api = make(*generator)
    opened = [gen_api]
    critic_side = None
    if critic is not None:
        api = gen_api
        if critic[1] != generator[1]:
            api = make(*critic)
            opened.append(api)
        critic_side = Side("critic", critic[0], api)
    return Sides(Side("generator", generator[0], gen_api), critic_side), opened
