"""A chat-completion request, validated as OpenAI validates it.

``parse_chat`` turns a decoded request body into a ``ChatRequest`` (what answering it
needs: the messages' texts, the prompt's tokens, the reply format asked for, the service tier and
the prompt cache key) or a ``Rejection`` (the status and OpenAI's error body).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from .config import SimConfig
from .content import AnswerMode, content_text, estimate_tokens
from .replies import error_body
from .tiers import TIERS

__all__ = [
    "DEFAULT_COST_COMPLETION_TOKENS",
    "ChatRequest",
    "Rejection",
    "model_error",
    "parse_chat",
]

DEFAULT_COST_COMPLETION_TOKENS: Final = 256
_UNPARSEABLE: Final = (
    "We could not parse the JSON body of your request. (HINT: This likely means you "
    "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)"
)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A valid chat-completion request, with what answering it needs."""

    model: str
    messages: list[dict[str, Any]]
    texts: list[str]
    prompt_tokens: int
    max_tokens: int | None
    mode: AnswerMode
    schema: Any
    tier: str | None = None  # the service_tier asked for
    cache_key: str | None = None  # the prompt_cache_key sent
    temperature: float | None = None  # the temperature asked for (None: not sent)

    @property
    def cost(self) -> int:
        """Tokens it may use: the prompt plus the completion limit (or a default)."""
        limit = self.max_tokens if self.max_tokens is not None else DEFAULT_COST_COMPLETION_TOKENS
        return self.prompt_tokens + limit


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request cannot be answered: the status, OpenAI's error body, the log outcome."""

    status: int
    body: bytes
    outcome: str


def _bad(message: str, param: str | None, code: str | None = None) -> Rejection:
    return Rejection(400, error_body(message, "invalid_request_error", param, code), "bad_request")


def model_error(model: str) -> bytes:
    """OpenAI's 404 body for a model that is not served."""
    message = f"The model `{model}` does not exist or you do not have access to it."
    return error_body(message, "invalid_request_error", None, "model_not_found")


def _answer_mode(cfg: SimConfig, fmt: Any) -> tuple[AnswerMode, Any] | Rejection:
    """The reply format ``response_format`` asks for, if the configured level supports it."""
    if fmt is None:
        return "text", None
    asked = fmt.get("type") if isinstance(fmt, dict) else None
    if cfg.structured == "none":
        return _bad(
            "Invalid parameter: 'response_format' is not supported by this server.",
            "response_format",
            "unsupported_parameter",
        )
    if asked == "text":
        return "text", None
    if asked == "json_schema" and cfg.structured == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            return _bad(
                "Missing required parameter: 'response_format.json_schema.name'.",
                "response_format.json_schema.name",
                "missing_required_parameter",
            )
        return "json", spec.get("schema", {})
    if asked == "json_object":
        return "json", fmt.get("schema")
    return _bad(
        f"Invalid parameter: 'response_format' of type '{asked}' is not supported by this server.",
        "response_format",
        "unsupported_value",
    )


def parse_chat(cfg: SimConfig, parsed: Any) -> ChatRequest | Rejection:
    """Validate a decoded request body (``None`` when it was not JSON) as OpenAI would."""
    if parsed is None:
        return _bad(_UNPARSEABLE, None)
    if not isinstance(parsed, dict):
        return _bad("The request body must be a JSON object.", None)
    model = parsed.get("model")
    if not isinstance(model, str) or not model:
        return _bad("you must provide a model parameter", "model")
    if cfg.models is not None and model not in cfg.models:
        return Rejection(404, model_error(model), "not_found")
    messages = parsed.get("messages")
    if not isinstance(messages, list) or not messages:
        return _bad(
            "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
        )
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            return _bad(f"Invalid value for 'messages[{i}]'.", f"messages[{i}]", "invalid_value")
    if parsed.get("stream"):
        return _bad("Streaming is not supported by the simulator.", "stream", "unsupported_value")
    limit = parsed.get("max_completion_tokens")
    if limit is None:
        limit = parsed.get("max_tokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        return _bad(
            "Invalid 'max_tokens': integer below minimum value.",
            "max_tokens",
            "integer_below_min_value",
        )
    mode = _answer_mode(cfg, parsed.get("response_format"))
    if isinstance(mode, Rejection):
        return mode
    options = _options(cfg, parsed)
    if isinstance(options, Rejection):
        return options
    texts = [content_text(m.get("content")) for m in messages]
    prompt_tokens = estimate_tokens(sum(len(x) for x in texts))
    temperature = parsed.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        temperature = None
    return ChatRequest(
        model, messages, texts, prompt_tokens, limit, mode[0], mode[1], *options, temperature
    )


def _options(cfg: SimConfig, parsed: dict[str, Any]) -> tuple[str | None, str | None] | Rejection:
    """The request's ``service_tier`` and ``prompt_cache_key``, checked as OpenAI does."""
    tier, key = parsed.get("service_tier"), parsed.get("prompt_cache_key")
    if tier is not None and tier not in TIERS:
        return _bad(
            f"Invalid value for 'service_tier': {tier!r}. Supported values are: "
            + ", ".join(f"'{t}'" for t in TIERS)
            + ".",
            "service_tier",
            "invalid_value",
        )
    if key is not None and not cfg.accept_cache_key:
        return _bad("Unrecognized request argument supplied: prompt_cache_key", None)
    if key is not None and not isinstance(key, str):
        return _bad("Invalid type for 'prompt_cache_key': expected a string.", "prompt_cache_key")
    return tier, key
