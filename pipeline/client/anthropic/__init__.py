"""Anthropic's dialect: Claude over the Messages API, in raw HTTP (no SDK needed).

::

    messages    pure functions: a call's params (system, breakpoints, the format's level)
                and what a Message, its usage and an error envelope say
    client      AnthropicClient: a calls.ChatClient posting /v1/messages

``AnthropicClient`` is imported when first asked for (PEP 562): it brings the HTTP
transport, which reading ``messages`` (``refine estimate``'s cache model) never needs.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import AnthropicClient


def __getattr__(name: str) -> Any:
    if name == "AnthropicClient":
        from .client import AnthropicClient

        return AnthropicClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AnthropicClient"]
