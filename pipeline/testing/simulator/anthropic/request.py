"""A Messages API request, validated as Anthropic validates it.

``parse_messages`` turns a decoded body into a ``MessagesRequest`` or an ``Invalid`` (the
status and message of Anthropic's error). The request keeps what answering and caching it
need: the prompt as blocks in the order Anthropic caches them (each tool, each system text
block, each message's content blocks), the ``cache_control`` breakpoints on them, the
conversation as plain text (what the answer derives from, as in the OpenAI dialect), and
the reply format asked for: text, JSON through ``output_config.format`` (structured
outputs), or a ``tool_use`` block forced by ``tool_choice``.

A server configured without JSON-schema support (``SimConfig.structured`` other than
"json_schema") refuses ``output_config.format``, as models without structured outputs
do; a forced tool always works. Unknown top-level fields are refused, as Anthropic
refuses them ("Extra inputs are not permitted"): a client sending OpenAI's
``response_format`` learns it at once. Content blocks other than text, tool_use and
tool_result (images, documents, thinking) and streaming are refused as not supported by
the simulator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from ..config import SimConfig

__all__ = [
    "MAX_BREAKPOINTS",
    "TTL_SECONDS",
    "Block",
    "Breakpoint",
    "Invalid",
    "MessagesRequest",
    "ReplyFormat",
    "parse_messages",
]

ReplyFormat = Literal["text", "json", "tool"]
MAX_BREAKPOINTS: Final = 4
TTL_SECONDS: Final[dict[str, float]] = {"5m": 300.0, "1h": 3600.0}
_FIELDS: Final = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "tools",
        "tool_choice",
        "output_config",
        "cache_control",
        "metadata",
        "thinking",
        "service_tier",
    }
)
_TOOL_NAME: Final = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_TOOL_CHOICES: Final = ("auto", "any", "tool", "none")
_EFFORTS: Final = ("low", "medium", "high", "xhigh", "max")


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why a request cannot be answered: the status and Anthropic's message."""

    status: int
    message: str


class _Refused(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Block:
    """One block of the prompt: a tool, a system text block, or a message's content block."""

    section: str  # "tools", "system" or "messages"
    role: str  # the message's role; "" outside messages
    opens: bool  # the first block of its message
    text: str  # what it adds to the prompt (four characters a token)
    canonical: bytes  # what identifies it in a prefix: its JSON without cache_control


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """A ``cache_control`` marker: the prefix through block ``block`` is cached for ``ttl``."""

    block: int
    ttl: str  # "5m" or "1h"

    @property
    def ttl_s(self) -> float:
        """The time to live in seconds."""
        return TTL_SECONDS[self.ttl]


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """A valid Messages API request, with what answering and caching it need."""

    model: str
    max_tokens: int
    blocks: tuple[Block, ...]
    breakpoints: tuple[Breakpoint, ...]
    conversation: list[dict[str, Any]]  # {"role", "content"} texts, the system prompt first
    texts: list[str]  # each conversation entry's text
    reply_format: ReplyFormat
    schema: Any  # the JSON schema a "json" or "tool" answer is an instance of
    tool: str | None  # the tool a "tool" answer uses
    tool_choice: bytes  # canonical JSON: a change invalidates the messages' cache
    output_format: bytes  # canonical JSON: a change invalidates the system's and messages'
    stop_sequences: tuple[str, ...]

    @property
    def chars(self) -> int:
        """Characters of the whole prompt."""
        return sum(len(b.text) for b in self.blocks)


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _without_marker(block: dict[str, Any]) -> bytes:
    return _canonical({k: v for k, v in block.items() if k != "cache_control"})


def _ttl(marker: Any, where: str) -> str:
    """The TTL of a ``cache_control`` value, checked."""
    if not isinstance(marker, dict) or marker.get("type") != "ephemeral":
        raise _Refused(f"{where}.type: Input should be 'ephemeral'")
    extra = set(marker) - {"type", "ttl"}
    if extra:
        raise _Refused(f"{where}.{sorted(extra)[0]}: Extra inputs are not permitted")
    ttl = marker.get("ttl", "5m")
    if ttl not in TTL_SECONDS:
        raise _Refused(f"{where}.ttl: Input should be '5m' or '1h'")
    return str(ttl)


def _int(value: Any, where: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Refused(f"{where}: Input should be a valid integer")
    if value < low:
        raise _Refused(f"{where}: Input should be greater than or equal to {low}")
    return value


def _number(value: Any, where: str, low: float, high: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _Refused(f"{where}: Input should be a valid number")
    if not low <= value <= high:
        raise _Refused(f"{where}: Input should be between {low:g} and {high:g}")


class _Prompt:
    """Collects the blocks and breakpoints of a request, in Anthropic's caching order."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.breakpoints: list[Breakpoint] = []

    def add(
        self, section: str, role: str, opens: bool, text: str, raw: dict[str, Any], where: str
    ) -> None:
        if "cache_control" in raw and raw["cache_control"] is not None:
            ttl = _ttl(raw["cache_control"], f"{where}.cache_control")
            self.breakpoints.append(Breakpoint(len(self.blocks), ttl))
        self.blocks.append(Block(section, role, opens, text, _without_marker(raw)))


def _text_block(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        raise _Refused(f"{where}.type: Input should be 'text'")
    text = block.get("text")
    if not isinstance(text, str):
        raise _Refused(f"{where}.text: Field required")
    if not text:
        raise _Refused(f"{where}: text content blocks must be non-empty")
    return text


def _content_text(block: dict[str, Any], where: str) -> str:
    """The text a message's content block adds to the prompt."""
    block_type = block.get("type")
    if block_type == "text":
        return _text_block(block, where)
    if block_type == "tool_use":
        name, value = block.get("name"), block.get("input")
        if not isinstance(name, str) or not isinstance(value, dict):
            raise _Refused(f"{where}: a tool_use block needs a name and an input object")
        return f"{name} {orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()}"
    if block_type == "tool_result":
        if not isinstance(block.get("tool_use_id"), str):
            raise _Refused(f"{where}.tool_use_id: Field required")
        content = block.get("content", "")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(_text_block(c, f"{where}.content.{i}") for i, c in enumerate(content))
        raise _Refused(f"{where}.content: Input should be a valid string or list")
    raise _Refused(
        f"{where}.type: content blocks of type {block_type!r} are not supported by the simulator"
    )


def _system(prompt: _Prompt, system: Any) -> str:
    """Add the system prompt's blocks; return its text."""
    if system is None:
        return ""
    if isinstance(system, str):
        blocks: list[Any] = [{"type": "text", "text": system}] if system else []
    elif isinstance(system, list):
        blocks = system
    else:
        raise _Refused("system: Input should be a valid string or list of text blocks")
    texts = []
    for i, block in enumerate(blocks):
        text = _text_block(block, f"system.{i}")
        prompt.add("system", "", False, text, block, f"system.{i}")
        texts.append(text)
    return "\n".join(texts)


def _messages(prompt: _Prompt, messages: Any) -> list[dict[str, Any]]:
    """Add the messages' blocks; return the turns as text (consecutive roles combined)."""
    if messages is None:
        raise _Refused("messages: Field required")
    if not isinstance(messages, list) or not messages:
        raise _Refused("messages: at least one message is required")
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            raise _Refused(f"{where}: Input should be a valid dictionary")
        role = message.get("role")
        if role == "system":
            raise _Refused(
                f'{where}.role: Unexpected role "system". The Messages API takes the system '
                "prompt as the top-level `system` parameter, not as a message."
            )
        if role not in ("user", "assistant"):
            raise _Refused(f"{where}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list) or not content:
            raise _Refused(f"{where}.content: Input should be a string or a non-empty list")
        texts = []
        for j, block in enumerate(content):
            if not isinstance(block, dict):
                raise _Refused(f"{where}.content.{j}: Input should be a valid dictionary")
            text = _content_text(block, f"{where}.content.{j}")
            prompt.add("messages", role, j == 0, text, block, f"{where}.content.{j}")
            texts.append(text)
        joined = "\n".join(texts)
        if turns and turns[-1]["role"] == role:  # Anthropic combines consecutive turns
            turns[-1]["content"] += "\n" + joined
        else:
            turns.append({"role": role, "content": joined})
    return turns


def _tools(prompt: _Prompt, tools: Any) -> dict[str, Any]:
    """Add the tools' blocks; return each tool's input schema by name."""
    if tools is None:
        return {}
    if not isinstance(tools, list):
        raise _Refused("tools: Input should be a valid list")
    schemas: dict[str, Any] = {}
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise _Refused(f"{where}: Input should be a valid dictionary")
        if tool.get("type") not in (None, "custom"):
            raise _Refused(f"{where}.type: server tools are not supported by the simulator")
        name = tool.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise _Refused(f"{where}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
        if name in schemas:
            raise _Refused("tools: Tool names must be unique.")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise _Refused(f"{where}.input_schema.type: Input should be 'object'")
        schemas[name] = schema
        text = f"{name}\n{tool.get('description', '')}\n{_canonical(schema).decode()}"
        prompt.add("tools", "", False, text, tool, where)
    return schemas


def _choice(choice: Any, schemas: dict[str, Any]) -> str | None:
    """The tool ``tool_choice`` forces, if any."""
    if choice is None:
        return None
    if not schemas:
        raise _Refused("tool_choice: tool_choice may only be specified while providing tools")
    mode = choice.get("type") if isinstance(choice, dict) else None
    if mode not in _TOOL_CHOICES:
        raise _Refused("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
    assert isinstance(choice, dict)
    if mode == "any":
        return next(iter(schemas))
    if mode == "tool":
        name = choice.get("name")
        if name not in schemas:
            raise _Refused(f"tool_choice.name: Tool {name!r} not found in the provided tools")
        return str(name)
    return None


def _output_format(config: Any, structured: bool) -> Any:
    """The JSON schema ``output_config.format`` asks the answer to follow, if any
    (refused unless the server takes structured outputs: ``structured``)."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise _Refused("output_config: Input should be a valid dictionary")
    extra = set(config) - {"format", "effort"}
    if extra:
        raise _Refused(f"output_config.{sorted(extra)[0]}: Extra inputs are not permitted")
    if config.get("effort") not in (None, *_EFFORTS):
        raise _Refused("output_config.effort: Input should be " + ", ".join(_EFFORTS))
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise _Refused("output_config.format.type: Input should be 'json_schema'")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise _Refused("output_config.format.schema: Field required")
    if not structured:
        raise _Refused("output_config.format: structured outputs are not supported by this model")
    return schema


def _options(body: dict[str, Any]) -> tuple[str, ...]:
    """Check the sampling options; return the stop sequences."""
    if body.get("stream"):
        raise _Refused("stream: streaming is not supported by the simulator")
    if body.get("temperature") is not None:
        _number(body["temperature"], "temperature", 0.0, 1.0)
    if body.get("top_p") is not None:
        _number(body["top_p"], "top_p", 0.0, 1.0)
    if body.get("top_k") is not None:
        _int(body["top_k"], "top_k", 0)
    thinking = body.get("thinking")
    if thinking is not None and thinking != {"type": "disabled"}:
        raise _Refused("thinking: extended thinking is not supported by the simulator")
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        raise _Refused("service_tier: Input should be 'auto' or 'standard_only'")
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _Refused("stop_sequences: Input should be a list of non-empty strings")
    return tuple(stops)


def _breakpoints(prompt: _Prompt, automatic: Any) -> tuple[Breakpoint, ...]:
    """The breakpoints, the top-level (automatic) one on the last block included, checked."""
    marks = list(prompt.breakpoints)
    if automatic is not None:
        ttl = _ttl(automatic, "cache_control")
        last = len(prompt.blocks) - 1
        if not any(b.block == last for b in marks):
            marks.append(Breakpoint(last, ttl))
    if len(marks) > MAX_BREAKPOINTS:
        raise _Refused(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(marks)}."
        )
    short = False
    for mark in marks:
        if mark.ttl == "5m":
            short = True
        elif short:
            raise _Refused(
                "A ttl='1h' cache_control block must not come after a ttl='5m' one. Blocks "
                "are processed in this order: `tools`, `system`, `messages`."
            )
    return tuple(marks)


def parse_messages(
    cfg: SimConfig, body: Any, *, counting: bool = False
) -> MessagesRequest | Invalid:
    """Validate a decoded body (``None`` when it was not JSON) as Anthropic would.

    ``counting`` validates a ``/v1/messages/count_tokens`` body, which has no max_tokens.
    """
    if not isinstance(body, dict):
        return Invalid(400, "The request body must be a JSON object.")
    try:
        return _parse(cfg, body, counting)
    except _Refused as refused:
        return Invalid(refused.status, refused.message)


def _parse(cfg: SimConfig, body: dict[str, Any], counting: bool) -> MessagesRequest:
    allowed = _FIELDS - {"max_tokens", "stream"} if counting else _FIELDS
    for name in body:
        if name not in allowed:
            raise _Refused(f"{name}: Extra inputs are not permitted")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _Refused("model: Field required")
    if cfg.models is not None and model not in cfg.models:
        raise _Refused(f"model: {model}", 404)
    max_tokens = 0
    if not counting:
        if "max_tokens" not in body:
            raise _Refused("max_tokens: Field required")
        max_tokens = _int(body["max_tokens"], "max_tokens", 0)
    stops = _options(body)
    prompt = _Prompt()
    schemas = _tools(prompt, body.get("tools"))
    system = _system(prompt, body.get("system"))
    turns = _messages(prompt, body.get("messages"))
    tool = _choice(body.get("tool_choice"), schemas)
    fmt = _output_format(body.get("output_config"), cfg.structured == "json_schema")
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise _Refused("metadata: Input should be a valid dictionary")
    breakpoints = _breakpoints(prompt, body.get("cache_control"))
    conversation = ([{"role": "system", "content": system}] if system else []) + turns
    reply_format: ReplyFormat = (
        "tool" if tool is not None else "json" if fmt is not None else "text"
    )
    return MessagesRequest(
        model=model,
        max_tokens=max_tokens,
        blocks=tuple(prompt.blocks),
        breakpoints=breakpoints,
        conversation=conversation,
        texts=[str(turn["content"]) for turn in conversation],
        reply_format=reply_format,
        schema=schemas[tool] if tool is not None else fmt,
        tool=tool,
        tool_choice=_canonical(body.get("tool_choice")),
        output_format=_canonical(fmt),
        stop_sequences=stops,
    )
