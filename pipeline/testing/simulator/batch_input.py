"""A Batch API input file read: its lines checked, and the fate drawn for each line."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Final

import orjson

from .config import BATCH_ENDPOINT, SimConfig
from .content import content_text, estimate_tokens
from .engine import DEFAULT_COST_COMPLETION_TOKENS

__all__ = [
    "MAX_REPORTED_ERRORS",
    "BatchLine",
    "BatchPlan",
    "LineFate",
    "enqueued_tokens",
    "line_error",
    "make_plan",
    "parse_input",
]

# A file of 50,000 bad lines would otherwise make every retrieve carry 50,000 errors.
MAX_REPORTED_ERRORS: Final = 100


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One valid input line: its 1-based line number, id, request body, enqueued tokens."""

    number: int
    custom_id: str
    body: dict[str, Any]
    tokens: int


def line_error(
    code: str, message: str, line: int | None = None, param: str | None = None
) -> dict[str, Any]:
    """One entry of a failed batch's ``errors.data``."""
    return {"code": code, "message": message, "param": param, "line": line}


def enqueued_tokens(body: dict[str, Any]) -> int:
    """What a line holds against the enqueued-token limit: prompt estimate plus max tokens."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        messages = []
    texts = [content_text(m.get("content")) for m in messages if isinstance(m, dict)]
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        limit = DEFAULT_COST_COMPLETION_TOKENS
    return estimate_tokens(sum(len(x) for x in texts)) + limit


def _line_problem(item: dict[str, Any], number: int) -> dict[str, Any] | None:
    """The error of a decoded line whose envelope is wrong, else None."""
    for name, wanted in (("custom_id", str), ("method", str), ("url", str), ("body", dict)):
        if name not in item:
            return line_error(
                "missing_required_parameter",
                f"Missing required parameter: '{name}'.",
                number,
                name,
            )
        if not isinstance(item[name], wanted) or (wanted is str and not item[name]):
            expected = "a JSON object" if wanted is dict else "a non-empty string"
            return line_error("invalid_request", f"'{name}' must be {expected}.", number, name)
    if item["method"] != "POST":
        return line_error(
            "invalid_method", "The method of every request must be POST.", number, "method"
        )
    if item["url"] != BATCH_ENDPOINT:
        return line_error(
            "invalid_url",
            "The URL provided for this request does not prefix-match the batch endpoint.",
            number,
            "url",
        )
    return None


def parse_input(data: bytes, cfg: SimConfig) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """The lines of a batch input file and the validation errors (the batch fails on any)."""
    if len(data) > cfg.batch_max_bytes:
        message = (
            f"The batch input file is larger than the {cfg.batch_max_bytes} byte maximum "
            f"({len(data)} bytes)."
        )
        return [], [line_error("file_too_large", message)]
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    model: str | None = None
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            item = orjson.loads(raw)
        except orjson.JSONDecodeError:
            errors.append(
                line_error("invalid_json_line", "This line is not parseable as valid JSON.", number)
            )
            continue
        if not isinstance(item, dict):
            errors.append(line_error("invalid_request", "Each line must be a JSON object.", number))
            continue
        problem = _line_problem(item, number)
        if problem is not None:
            errors.append(problem)
            continue
        custom_id: str = item["custom_id"]
        body: dict[str, Any] = item["body"]
        line_model = body.get("model")
        if custom_id in seen:
            errors.append(
                line_error(
                    "duplicate_custom_id",
                    "The custom_id for this request is a duplicate of another request. The "
                    "custom_id parameter must be unique for each request in a batch.",
                    number,
                    "custom_id",
                )
            )
        elif not isinstance(line_model, str) or not line_model:
            errors.append(
                line_error(
                    "missing_required_parameter",
                    "Missing required parameter: 'model'.",
                    number,
                    "body.model",
                )
            )
        elif cfg.models is not None and line_model not in cfg.models:
            errors.append(
                line_error(
                    "model_not_found",
                    f"The model `{line_model}` does not exist or you do not have access to it.",
                    number,
                    "body.model",
                )
            )
        elif model is not None and line_model != model:
            errors.append(
                line_error(
                    "mismatched_model",
                    f"The model `{line_model}` does not match the model `{model}` of the other "
                    "requests in this batch. All requests in a batch must use the same model.",
                    number,
                    "body.model",
                )
            )
        else:
            model = line_model
        seen.add(custom_id)
        lines.append(BatchLine(number, custom_id, body, enqueued_tokens(body)))
    if not errors and not lines:
        errors.append(line_error("empty_file", "The batch input file is empty."))
    if not errors and len(lines) > cfg.batch_max_requests:
        message = (
            f"The batch input file contains {len(lines)} requests; a batch may contain at most "
            f"{cfg.batch_max_requests}."
        )
        errors.append(line_error("too_many_requests", message))
    return lines, errors[:MAX_REPORTED_ERRORS]


@dataclass(frozen=True, slots=True)
class LineFate:
    """What happens to one line: a failure status, or an answer (perhaps cut or refused)."""

    fail_status: int | None = None
    cut: bool = False
    refuse: bool = False


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """How a validated batch runs: processing order, lines finished, expiry, each line's fate."""

    order: tuple[int, ...]
    finish: int
    expires: bool
    fates: tuple[LineFate, ...]


def make_plan(n: int, cfg: SimConfig, rng: random.Random) -> BatchPlan:
    """Draw the plan of an ``n``-line batch (a fixed number of draws per line)."""
    expires = rng.random() < cfg.p_batch_expire
    order = list(range(n))
    if cfg.batch_shuffle:
        rng.shuffle(order)
    statuses = cfg.line_fail_statuses
    fates: list[LineFate] = []
    for _ in range(n):
        fail, pick, cut, refuse = rng.random(), rng.random(), rng.random(), rng.random()
        status = statuses[int(pick * len(statuses))] if fail < cfg.p_line_fail else None
        fates.append(LineFate(status, cut < cfg.p_length, refuse < cfg.p_refusal))
    finish = math.floor(n * cfg.expire_fraction) if expires else n
    return BatchPlan(tuple(order), finish, expires, tuple(fates))
