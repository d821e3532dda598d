"""Feedback: tolerant parsing of the critic's JSON, and rendering it for prompts.

Endpoints differ in how well they honour structured output, so the parser
accepts a bare object, an object inside a ```json fence, an object surrounded
by prose, trailing commas and Python-style literals. Pure functions only.
"""

from __future__ import annotations

import io
import math
import re
import tokenize
from collections.abc import Mapping
from typing import Any

import orjson

from ..errors import FeedbackParseError
from .pyast import literal

__all__ = ["normalize", "parse_feedback", "render_feedback"]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_SCORE_TEXT = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?\s*$")
_JSON_NAMES = {"true": "True", "false": "False", "null": "None"}
_TRUE = {"true", "yes", "y", "1", "done"}


def _candidates(text: str) -> list[str]:
    found = [text.strip()]
    found += [m.group(2).strip() for m in _FENCE.finditer(text)]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        found.append(text[start : end + 1])
    return found


def _loads(candidate: str) -> Any:
    try:
        return orjson.loads(candidate)
    except orjson.JSONDecodeError:
        pass
    repaired = _TRAILING_COMMA.sub(r"\1", candidate)
    try:
        return orjson.loads(repaired)
    except orjson.JSONDecodeError:
        pass
    # Python-style literals (single quotes, True/False/None), with JSON's names
    # swapped only where they are names, never inside strings.
    try:
        return literal(_pythonic(repaired))
    except (ValueError, SyntaxError, MemoryError, RecursionError, tokenize.TokenError):
        return None


def _pythonic(text: str) -> str:
    tokens = [
        tok._replace(string=_JSON_NAMES[tok.string])
        if tok.type == tokenize.NAME and tok.string in _JSON_NAMES
        else tok
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
    ]
    return tokenize.untokenize(tokens)


def parse_feedback(
    text: str, *, actions_field: str, done_field: str, score_field: str | None
) -> dict[str, Any]:
    """Parse a feedback answer into a dict with normalised action/done/score fields."""
    if not text or not text.strip():
        raise FeedbackParseError("empty feedback")
    for candidate in _candidates(text):
        obj = _loads(candidate)
        if isinstance(obj, dict):
            return normalize(
                obj, actions_field=actions_field, done_field=done_field, score_field=score_field
            )
    raise FeedbackParseError(f"no JSON object found in feedback: {text[:120]!r}")


def normalize(
    obj: Mapping[str, Any], *, actions_field: str, done_field: str, score_field: str | None
) -> dict[str, Any]:
    """Coerce the fields the loop relies on; other fields pass through unchanged."""
    out = dict(obj)
    actions = out.get(actions_field)
    if actions is None:
        actions = []
    elif isinstance(actions, str):
        actions = [actions] if actions.strip() else []
    elif isinstance(actions, list):
        actions = [a if isinstance(a, str) else orjson.dumps(a).decode() for a in actions]
    else:
        actions = [str(actions)]
    out[actions_field] = actions

    done = out.get(done_field, False)
    if isinstance(done, str):
        done = done.strip().lower() in _TRUE
    out[done_field] = bool(done) if isinstance(done, bool | int | float) else False

    if score_field is not None:
        out[score_field] = _score(out.get(score_field))
    return out


def _score(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        m = _SCORE_TEXT.match(value)
        if m:
            return float(m.group(1))
    return None


def render_feedback(
    parsed: Mapping[str, Any] | None,
    raw: str,
    *,
    actions_field: str,
    done_field: str,
    score_field: str | None,
) -> str:
    """Feedback as text for a refine prompt: actions as a list, then score and other notes."""
    if parsed is None:
        return raw.strip()
    lines = []
    actions = parsed.get(actions_field) or []
    if actions:
        lines.append("Actions:")
        lines += [f"- {a}" for a in actions]
    else:
        lines.append("Actions: none")
    if score_field is not None and parsed.get(score_field) is not None:
        lines.append(f"Score: {parsed[score_field]:g}")
    for key, value in parsed.items():
        if key in (actions_field, done_field, score_field) or value in (None, "", [], {}):
            continue
        shown = value if isinstance(value, str) else orjson.dumps(value).decode()
        lines.append(f"{key.replace('_', ' ').capitalize()}: {shown}")
    return "\n".join(lines)
