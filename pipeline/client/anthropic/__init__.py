"""Anthropic's dialect: Claude over the Messages API, in raw HTTP (no SDK needed).

::

    messages    pure functions: a call's params (system, breakpoints, the format's level)
                and what a Message, its usage and an error envelope say
    client      AnthropicClient: a calls.ChatClient posting /v1/messages
"""

from .client import AnthropicClient

__all__ = ["AnthropicClient"]
