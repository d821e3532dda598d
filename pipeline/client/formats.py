"""The structured-output ladder: how feedback JSON is asked for, and stepping down it.

Endpoints differ: OpenAI takes ``response_format: json_schema``; llama.cpp-style servers
take ``json_object`` with a ``schema``; others only plain text with the schema spelled out
in the prompt. Anthropic's Messages API has its own three levels at the same places
(``anthropic.messages``): structured outputs (``output_config.format``), a forced tool
call, plain text; the ladder's state and its steps are the same for both dialects. The
ladder steps down only for an error answer that is about the format (``refusal_of``): one
that names it moves every later call of the run one level down at once; a bare 400 that
names nothing might be our format or the request itself, so only that call goes one level
down, and after a few such calls succeed there, the whole pool follows. An error that
names another cause (the context length, max_tokens, ...) is no refused format: the call
fails at once with the provider's message.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

__all__ = [
    "FORMAT_VOTES",
    "LEVELS",
    "FormatLadder",
    "Refusal",
    "format_refused",
    "refusal_of",
    "without_lengths",
]

LEVELS = ("json_schema", "json_object", "text")
_HINTS = (
    "response_format",
    "json",
    "schema",
    "grammar",
    # Anthropic's: the structured-output field and the forced tool of the level below
    "output_config",
    "output format",
    "structured output",
    "tool",
)
# Calls that had to go one level down after a 400 naming nothing before the whole pool
# goes down too.
FORMAT_VOTES = 3
# A prompt past the model's context window, as OpenAI, vLLM, llama.cpp and others say it.
_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_CONTEXT_WORDS = re.compile(
    r"context[ _]?(length|window|size)|maximum context|too many tokens|prompt is too long"
    r"|input is too long|reduce the length|context limit",
    re.IGNORECASE,
)
# The words of an error message that names no cause at all ("Bad Request", "Error code: 400").
_BARE_WORDS = frozenset(
    {"bad", "request", "invalid", "error", "code", "http", "status", "unprocessable", "entity"}
)


class Refusal(enum.Enum):
    """What an error answer to a structured request says about the format."""

    FORMAT = "format"  # it names the response format: the endpoint refuses ours
    UNNAMED = "unnamed"  # a bare 400/422 naming no cause: maybe the format, maybe not
    OTHER = "other"  # it names another cause (context length, max_tokens, ...)


def refusal_of(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> Refusal:
    """What an error answer (its status, message, and OpenAI's ``code`` and ``param``) means
    for the format ladder."""
    if (code or "").lower() in _CONTEXT_CODES or _CONTEXT_WORDS.search(message):
        return Refusal.OTHER
    if (param or "").startswith("response_format") or format_refused(status, message):
        return Refusal.FORMAT
    if status in (400, 422) and _names_nothing(message):
        return Refusal.UNNAMED
    return Refusal.OTHER


def _names_nothing(message: str) -> bool:
    words = re.findall(r"[a-z]+", message.lower())
    return all(w in _BARE_WORDS for w in words)


def format_refused(status: int, message: str) -> bool:
    """Whether an error answer says the server does not take our ``response_format``.

    Most servers answer 400 or 422; llama-cpp-python's server answers 500 with a
    validation error naming ``response_format``.
    """
    text = message.lower()
    if status in (400, 422):
        return any(h in text for h in _HINTS)
    return status == 500 and "response_format" in text


def without_lengths(schema: Any) -> Any:
    """``schema`` without ``maxLength``/``minLength``, which OpenAI's strict mode refuses.

    llama.cpp's servers get the full schema (``json_object``, and ``json_schema`` to a
    ladder made with ``grammar``): their grammar enforces the lengths, which keeps a small
    model from repeating one phrase until max_tokens.
    """
    if isinstance(schema, dict):
        return {
            k: without_lengths(v) for k, v in schema.items() if k not in ("maxLength", "minLength")
        }
    if isinstance(schema, list):
        return [without_lengths(v) for v in schema]
    return schema


def _strict_ok(schema: Mapping[str, Any]) -> bool:
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    return schema.get("additionalProperties") is False and required == set(props)


def schema_instruction(schema: Mapping[str, Any]) -> str:
    """The prompt suffix that spells the schema out for levels below ``json_schema``."""
    return (
        "\n\nAnswer with a single JSON object and nothing else. It must match this JSON Schema:\n"
        "```json\n" + orjson.dumps(schema, option=orjson.OPT_INDENT_2).decode() + "\n```"
    )


class FormatLadder:
    """The run's structured-output level, shared by every call.

    With ``grammar`` (llama.cpp's server), ``json_schema`` is enforced by a grammar built
    from the schema: the schema goes whole, string lengths included, and is spelled out in
    the prompt too, since such a server shows the model nothing of it. Without the field
    names and what each should hold, a small model fills the fields it is made to write
    with punctuation (docs/backends.md, "The local model").
    """

    __slots__ = ("_votes", "grammar", "level")

    def __init__(self, start: str = "json_schema", *, grammar: bool = False) -> None:
        self.level = LEVELS.index(start)
        self.grammar = grammar
        self._votes = 0

    @property
    def name(self) -> str:
        """The pool's current level."""
        return LEVELS[self.level]

    def request(
        self, messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None, level: int
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """The messages to send and the extra body fields asking for ``schema`` at ``level``."""
        sent = [dict(m) for m in messages]
        extra: dict[str, Any] = {}
        if schema is None:
            return sent, extra
        if LEVELS[level] == "json_schema":
            extra["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "feedback",
                    "schema": dict(schema) if self.grammar else without_lengths(schema),
                    "strict": _strict_ok(schema),
                },
            }
        elif LEVELS[level] == "json_object":
            extra["response_format"] = {"type": "json_object", "schema": dict(schema)}
        # json_object needs the word JSON in the prompt on some servers, plain text needs
        # the schema spelled out, and a grammar shows the model nothing: all get the
        # instruction. OpenAI shows its model the json_schema itself.
        if LEVELS[level] != "json_schema" or self.grammar:
            sent[-1]["content"] = sent[-1]["content"] + schema_instruction(schema)
        return sent, extra

    def refused(
        self,
        status: int,
        message: str,
        level: int,
        *,
        code: str | None = None,
        param: str | None = None,
    ) -> int | None:
        """The level this call should try next after an error answer, or None.

        None means the error is not about the format (or there is no level left).
        """
        if level >= len(LEVELS) - 1:
            return None
        refusal = refusal_of(status, message, code, param)
        if refusal is Refusal.FORMAT:
            self.level = max(self.level, level + 1)
            return self.level
        if refusal is Refusal.UNNAMED:
            return level + 1
        return None

    def succeeded(self, level: int) -> None:
        """A call succeeded at ``level``: below the pool's after a bare 400, that is a vote."""
        if level > self.level:
            self._votes += 1
            if self._votes >= FORMAT_VOTES:
                self.level = level
