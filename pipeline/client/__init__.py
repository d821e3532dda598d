"""The model client: one model call, paced, retried, paid for, in a provider's dialect.

::

    calls       ChatClient: the loop around one call, whatever the dialect
    chat        OpenAIClient: one chat call around the openai SDK (its retries off)
    anthropic   AnthropicClient: Claude over Anthropic's Messages API (raw HTTP)
    attempts    a call's attempts: the one retry sequence (real time and Batch API lines)
    replies     reading a chat completion (text, usage, tier) and an error's message
    retry       the retry policy (pure functions)
    delays      every wait between attempts and probes: one frozen value, given to the client
    outage      the per-endpoint breaker: an endpoint down for everyone is probed
    formats     the structured-output ladder (json_schema, json_object, text)
    replicas    several replicas of one model; requests go to the least loaded
    limits      request and token pacing (our own GCRA pacer; see the module)
    prices      dollars per million tokens by model, cached and batch rates
    budget      the spending cap: reserve the worst case, then settle
    caching     the prompt cache key, dropped for an endpoint that refuses it
    models      model ids: a provider (by prefix: local:, anthropic:) and a name
    flex        service tiers; the flex tier's refusals waited out as capacity
    context     context windows: a prompt that cannot fit its model is not sent
    reach       an endpoint that cannot be reached at all; the free pre-flight

Imports only ``pipeline.core`` (the call's record types) and ``pipeline.errors``.
"""

from typing import TYPE_CHECKING, Any

from .budget import Budget, Reservation, Spending
from .limits import Limiter, RateLimiter, estimate_tokens
from .prices import Price, PriceBook, load_prices, price_book

if TYPE_CHECKING:
    from .chat import OpenAIClient


def __getattr__(name: str) -> Any:
    """``OpenAIClient`` is imported when first asked for (PEP 562): it brings the HTTP SDK,
    which a command that calls no model never needs."""
    if name == "OpenAIClient":
        from .chat import OpenAIClient

        return OpenAIClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Budget",
    "Limiter",
    "OpenAIClient",
    "Price",
    "PriceBook",
    "RateLimiter",
    "Reservation",
    "Spending",
    "estimate_tokens",
    "load_prices",
    "price_book",
]
