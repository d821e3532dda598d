"""Anthropic's Messages API as pure functions: a request's body, and what an answer says.

Shared by the real-time client (``client``) and Message Batches (``batches``), whose lines
carry the same params and the same Message objects.

**The body.** The run's conversation (``core.prompts``: the system message, then user and
assistant turns) becomes ``system`` (text blocks) and ``messages`` (each turn one text
block); ``max_tokens`` is always set; the temperature is clamped to Anthropic's [0, 1];
Anthropic has no frequency penalty, so a repair differs from the call it repeats only by
sampling. The feedback's schema is asked for at the format ladder's level (``formats``):

    0  structured outputs: ``output_config.format``, a JSON schema the answer must follow
       (constraints Anthropic does not take, such as lengths and bounds, are left out);
    1  a forced tool call: the schema as the ``input_schema`` of a ``feedback`` tool that
       ``tool_choice`` makes the model call; its input is the answer;
    2  plain text: the schema spelled out at the end of the request.

**The cache.** Anthropic caches a prompt's prefix only up to blocks marked with
``cache_control`` (at most 4 a request), each read by a later request whose prompt starts
with the same blocks (looked up from each breakpoint back over about 20 blocks), and only
when the prefix holds the model's minimum (``MIN_CACHE_TOKENS``). A record's calls extend
one another, so three breakpoints serve them (``breakpoints``): the end of the system
prompt (shared by every record of the job), the end of the first user turn (the record's
input: what a call that starts the conversation afresh, as strategy ``restart``'s, still
shares) and the end of the call's own prompt, its last user turn: the next call reads all
of it and writes only what it adds. Breakpoints cost nothing; what a request writes to the
cache costs 1.25 times the input price for 5 minutes (``ttl`` ``5m``), 2 times for an hour
(``1h``); a read costs 0.1 times. Changing the tools, or ``output_config.format``, misses
the cache from the system prompt on, and changing ``tool_choice`` misses the messages:
so a feedback call at level 0 or 1 reads what the record's previous feedback call wrote,
not the answer call before it (docs/costs.md: what each level costs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from ...errors import CallError
from ..formats import LEVELS, schema_instruction
from ..models import ModelId
from ..prices import model_family

__all__ = [
    "API_VERSION",
    "DEFAULT_MIN_CACHE_TOKENS",
    "FEEDBACK_TOOL",
    "MIN_CACHE_TOKENS",
    "TTLS",
    "breakpoints",
    "error_of",
    "messages_body",
    "min_cache_tokens",
    "read_message",
    "sent_messages",
    "strict_schema",
]

API_VERSION: Final = "2023-06-01"  # the anthropic-version header every request carries
TTLS: Final = ("5m", "1h")
FEEDBACK_TOOL: Final = "feedback"  # the tool a feedback call is made to call (level 1)
# The shortest prefix each model caches (the prompt-caching page of Anthropic's docs);
# others: DEFAULT_MIN_CACHE_TOKENS.
MIN_CACHE_TOKENS: Final[Mapping[str, int]] = {
    "claude-opus-4-6": 4096,
    "claude-opus-4-5": 4096,
    "claude-haiku-4-5": 4096,
    "claude-3-5-haiku": 2048,
}
DEFAULT_MIN_CACHE_TOKENS: Final = 1024
# Schema keywords structured outputs refuse: bounds, lengths and counts. (A forced tool's
# input_schema keeps them: the model reads them as guidance.)
_UNSUPPORTED: Final = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "maxItems",
        "pattern",
    }
)
# stop_reason values of an answer cut off before its end: the loop's repair applies.
_CUT_OFF: Final = frozenset({"max_tokens", "model_context_window_exceeded"})
_EMPTY: Final = "(empty)"  # Anthropic refuses a text block without text


def min_cache_tokens(model: str) -> int:
    """The shortest prefix ``model`` (a run's id or a bare name) caches."""
    name = model_family(ModelId.parse(model).name)
    return MIN_CACHE_TOKENS.get(name, DEFAULT_MIN_CACHE_TOKENS)


def strict_schema(schema: Any) -> Any:
    """``schema`` as structured outputs take it: without the keywords they refuse (and
    ``minItems`` above 1), every object closed (``additionalProperties: false``)."""
    if isinstance(schema, list):
        return [strict_schema(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_schema(v) for k, v in schema.items() if k not in _UNSUPPORTED}
    if isinstance(out.get("minItems"), int) and out["minItems"] > 1:
        del out["minItems"]
    if out.get("type") == "object":
        out["additionalProperties"] = False
    return out


def sent_messages(
    messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None, level: int
) -> list[dict[str, str]]:
    """The conversation as sent, in the run's form: at the plain-text level, the schema
    spelled out at the end of the last turn (the API shows it to the model at the others)."""
    sent = [dict(m) for m in messages]
    if schema is not None and LEVELS[level] == "text":
        sent[-1]["content"] = sent[-1]["content"] + schema_instruction(schema)
    return sent


def breakpoints(sent: Sequence[Mapping[str, str]]) -> list[int]:
    """The turns whose end is a cache breakpoint: the system prompt, the first user turn,
    the last turn (each once, in order)."""
    marks: list[int] = []
    if sent and sent[0]["role"] == "system":
        marks.append(0)
    first_user = next((i for i, m in enumerate(sent) if m["role"] == "user"), None)
    for index in (first_user, len(sent) - 1):
        if index is not None and index not in marks:
            marks.append(index)
    return marks


def _block(text: str, ttl: str | None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text if text.strip() else _EMPTY}
    if ttl is not None:
        # 5 minutes is the default; saying it would trouble servers that know no TTL.
        block["cache_control"] = {"type": "ephemeral", **({"ttl": ttl} if ttl == "1h" else {})}
    return block


def messages_body(
    model: str,
    sent: Sequence[Mapping[str, str]],
    *,
    temperature: float,
    max_tokens: int,
    schema: Mapping[str, Any] | None,
    level: int,
    ttl: str | None,
) -> dict[str, Any]:
    """The Messages API params of one call: ``sent`` (``sent_messages``) for ``model``, the
    schema (if any) asked for at ``level``, cache breakpoints for ``ttl`` (None: none)."""
    marks = set(breakpoints(sent)) if ttl is not None else set()
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, m in enumerate(sent):
        block = _block(m["content"], ttl if i in marks else None)
        if m["role"] == "system":
            system.append(block)
        else:
            turns.append({"role": m["role"], "content": [block]})
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": min(1.0, max(0.0, temperature)),
        "messages": turns,
    }
    if system:
        body["system"] = system
    if schema is not None and LEVELS[level] == "json_schema":
        body["output_config"] = {"format": {"type": "json_schema", "schema": strict_schema(schema)}}
    elif schema is not None and LEVELS[level] == "json_object":
        body["tools"] = [
            {
                "name": FEEDBACK_TOOL,
                "description": "Give your feedback on the answer, as the request asks.",
                "input_schema": dict(schema),
            }
        ]
        body["tool_choice"] = {"type": "tool", "name": FEEDBACK_TOOL}
    return body


def read_message(data: Any, ttl: str | None = None) -> dict[str, Any]:
    """The text, finish reason and usage of a Message object; CallError if it is none.

    A forced tool's input is the text (as JSON). ``finish_reason`` is "length" for an
    answer cut off (``max_tokens``), else "stop"; a refusal and an empty answer are
    failures. Usage: every prompt token (``prompt_tokens``: uncached, written and read),
    those read from the cache (``cached_tokens``), those written to it
    (``cache_write_tokens``; ``cache_write_1h_tokens`` at the one-hour TTL: the answer's
    breakdown, else all of them when the call asked for ``ttl`` 1h).
    """
    try:
        blocks = data["content"]
        stop = data.get("stop_reason")
        usage = data.get("usage") or {}
        parts = []
        for block in blocks:
            if block.get("type") == "text":
                parts.append(str(block.get("text") or ""))
            elif block.get("type") == "tool_use" and isinstance(block.get("input"), dict):
                parts.append(orjson.dumps(block["input"]).decode())
    except (KeyError, TypeError, AttributeError) as err:
        raise CallError("bad_response", "malformed response body (no content)") from err
    if stop == "refusal":
        raise CallError("refusal", "model refused (stop_reason refusal)")
    text = "".join(parts)
    if not text:
        raise CallError("empty", "empty answer")
    read = _count(usage, "cache_read_input_tokens")
    written = _count(usage, "cache_creation_input_tokens")
    breakdown = usage.get("cache_creation")
    if isinstance(breakdown, dict) and "ephemeral_1h_input_tokens" in breakdown:
        long = _count(breakdown, "ephemeral_1h_input_tokens")
    else:
        long = written if ttl == "1h" else 0
    return {
        "service_tier": None,  # Anthropic's tiers are not the run's --service-tier
        "text": text,
        "finish_reason": "length" if stop in _CUT_OFF else "stop",
        "usage": {
            "prompt_tokens": _count(usage, "input_tokens") + written + read,
            "completion_tokens": _count(usage, "output_tokens"),
            "cached_tokens": read,
            "cache_write_tokens": written,
            "cache_write_1h_tokens": min(long, written),
        },
    }


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and value > 0 else 0


def error_of(body: Any) -> tuple[str | None, str | None]:
    """The error's type and message in Anthropic's envelope (``{"type": "error", "error":
    {"type", "message"}}``, nested once more in a batch's errored result), where it has one."""
    inner = body
    for _ in range(3):
        if isinstance(inner, dict) and isinstance(inner.get("error"), dict):
            inner = inner["error"]
    if not isinstance(inner, dict):
        return None, None
    kind, message = inner.get("type"), inner.get("message")
    return (
        kind if isinstance(kind, str) else None,
        message if isinstance(message, str) else None,
    )
