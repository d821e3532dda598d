"""Anthropic's API, as the simulator speaks it beside OpenAI's.

Routes (``x-api-key`` and ``anthropic-version`` required on each): ``POST /v1/messages``,
``POST /v1/messages/count_tokens``, ``GET /v1/models[/{id}]`` (with ``anthropic-version``),
and Message Batches: ``POST``/``GET /v1/messages/batches``, ``GET``/``DELETE
/v1/messages/batches/{id}``, ``POST …/{id}/cancel``, ``GET …/{id}/results``. Errors come in
Anthropic's envelope, every reply carries ``request-id`` (and the ``anthropic-ratelimit-*``
headers of the limits configured).

Modules: ``request`` (validating a request: blocks, breakpoints, the reply format),
``caching`` (the prompt cache: breakpoints, minimum lengths, lookback, TTL), ``prices``
(the models' prices and minimums, usage, the bill's charge), ``limits`` (requests, input
and output tokens per minute), ``faults`` (the simulator's faults in Anthropic's words),
``messages`` (answering), ``batches`` (Message Batches), ``errors`` (the envelope, ids,
the two headers), ``api`` (routing).
"""

from .api import AnthropicApi, is_anthropic
from .caching import BreakpointCache, CacheUse
from .prices import MODELS, ModelCard, Usage

__all__ = [
    "MODELS",
    "AnthropicApi",
    "BreakpointCache",
    "CacheUse",
    "ModelCard",
    "Usage",
    "is_anthropic",
]
