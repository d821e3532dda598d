"""The Batch API: batches of chat completions read from uploaded files, run in scaled time.

A batch is ``validating`` for ``batch_validating_s``, ``in_progress`` for ``batch_delay_s``
(its lines finish steadily over that window, in shuffled order unless told otherwise),
``finalizing`` for ``batch_finalizing_s``, then ``completed``. Validation fails it (status
``failed``, with ``errors``) for a malformed line, a wrong ``url``, a duplicate
``custom_id``, mixed or unknown models, too many lines, too many bytes, or enqueued tokens
over ``batch_token_limit``. An expiring batch (``p_batch_expire``) stops after
``expire_fraction`` of its lines and ends ``expired``; a cancelled one goes ``cancelling``
for ``batch_finalizing_s``, then ``cancelled``; both keep the lines already finished, and
report the rest as ``batch_expired`` / ``batch_cancelled`` in the error file.

Every line is answered by the chat engine (same content and usage as a real-time call,
without the real-time limits and transport faults; ``p_length`` and ``p_refusal`` still
apply, per line) and logged with its ``batch_id`` and ``custom_id``. A line fails
(``p_line_fail``) with one of ``line_fail_statuses`` and lands in the error file.
Decisions (expiry, failed lines, order) are drawn from ``faults_seed`` and the batch's
creation sequence number, so they repeat run after run.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qs

import orjson

from .batch_input import (
    BatchLine,
    BatchPlan,
    LineFate,
    enqueued_tokens,
    line_error,
    make_plan,
    parse_input,
)
from .config import BATCH_ENDPOINT, SimConfig
from .engine import Engine
from .files import FileStore
from .replies import Reply, error_body, error_reply, json_reply, new_id, page, query_int

__all__ = [
    "TERMINAL",
    "BatchLine",
    "BatchPlan",
    "BatchStore",
    "LineFate",
    "enqueued_tokens",
    "make_plan",
    "parse_input",
]

TERMINAL: Final = frozenset({"failed", "completed", "expired", "cancelled"})
# Statuses whose lines count against the enqueued-token limit (validated, not yet over).
_ENQUEUED: Final = frozenset({"in_progress", "finalizing", "cancelling"})
COMPLETION_WINDOW: Final = "24h"
_WINDOW_S: Final = 24 * 3600
_METADATA_KEYS: Final = 16
_METADATA_KEY_CHARS: Final = 64
_METADATA_VALUE_CHARS: Final = 512
_UNFINISHED: Final = {
    "expired": (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    "cancelled": (
        "batch_cancelled",
        "This request was not executed because the batch was cancelled.",
    ),
}


@dataclass(slots=True)
class _Batch:
    """One batch's state; ``due`` is when its current phase ends (server clock)."""

    id: str
    input_file_id: str
    data: bytes
    metadata: dict[str, str] | None
    config: SimConfig
    rng: random.Random
    due: float
    stamps: dict[str, int]
    status: str = "validating"
    started: float = 0.0
    lines: list[BatchLine] = field(default_factory=list)
    plan: BatchPlan | None = None
    done: int = 0
    total: int = 0
    model: str | None = None
    enqueued: int = 0
    errors: list[dict[str, Any]] | None = None
    output: list[bytes] = field(default_factory=list)
    failures: list[bytes] = field(default_factory=list)
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None

    def to_object(self) -> dict[str, Any]:
        """The API's Batch object."""
        stamps = self.stamps
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": BATCH_ENDPOINT,
            "model": self.model,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": COMPLETION_WINDOW,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": stamps["created_at"],
            "in_progress_at": stamps.get("in_progress_at"),
            "expires_at": stamps["expires_at"],
            "finalizing_at": stamps.get("finalizing_at"),
            "completed_at": stamps.get("completed_at"),
            "failed_at": stamps.get("failed_at"),
            "expired_at": stamps.get("expired_at"),
            "cancelling_at": stamps.get("cancelling_at"),
            "cancelled_at": stamps.get("cancelled_at"),
            "request_counts": {
                "total": self.total,
                "completed": self.completed,
                "failed": self.failed,
            },
            "usage": {
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens + self.output_tokens,
            },
            "metadata": self.metadata,
        }


def _metadata_problem(metadata: Any) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        return "Invalid 'metadata': expected an object of string keys and string values."
    if len(metadata) > _METADATA_KEYS:
        return (
            f"Invalid 'metadata': too many properties. Expected an object with at most "
            f"{_METADATA_KEYS} properties, but got an object with {len(metadata)} properties."
        )
    for key, value in metadata.items():
        if len(key) > _METADATA_KEY_CHARS:
            return f"Invalid 'metadata': keys may have at most {_METADATA_KEY_CHARS} characters."
        if not isinstance(value, str) or len(value) > _METADATA_VALUE_CHARS:
            return (
                f"Invalid 'metadata': values must be strings of at most "
                f"{_METADATA_VALUE_CHARS} characters."
            )
    return None


class BatchStore:
    """Every batch of this server, in creation order; the HTTP routes under ``/v1/batches``."""

    def __init__(self, engine: Engine, files: FileStore, wall0: float) -> None:
        """``wall0`` is the Unix time at server-clock zero (for the objects' timestamps)."""
        self._engine = engine
        self._files = files
        self._wall0 = wall0
        self._batches: dict[str, _Batch] = {}
        self._active: list[_Batch] = []
        self._seq = itertools.count()
        # Requests and ticks run on the server thread; snapshots may come from another.
        self._lock = threading.Lock()

    def wall(self, at: float) -> int:
        """The Unix timestamp of server-clock time ``at``."""
        return int(self._wall0 + at)

    # -- HTTP --------------------------------------------------------------------------

    def handle(
        self, cfg: SimConfig, method: str, path: str, query: str, raw: bytes, now: float
    ) -> Reply:
        """Route a request under ``/v1/batches`` (``path`` without a trailing slash)."""
        rest = path[len("/v1/batches") :].lstrip("/")
        batch_id, _, sub = rest.partition("/")
        with self._lock:
            self._advance(cfg, now)
            if not batch_id:
                if method == "POST":
                    return self._create(cfg, raw, now)
                if method == "GET":
                    return self._listing(parse_qs(query))
            else:
                batch = self._batches.get(batch_id)
                if batch is None and method in ("GET", "POST"):
                    return error_reply(404, f"No batch found with id '{batch_id}'.", "batch_id")
                if batch is not None and sub == "" and method == "GET":
                    return json_reply(batch.to_object())
                if batch is not None and sub == "cancel" and method == "POST":
                    return self._cancel(batch, now)
        return error_reply(404, f"Invalid URL ({method} {path})", None, "unknown_url")

    def _create(self, cfg: SimConfig, raw: bytes, now: float) -> Reply:
        try:
            params: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            params = None
        if not isinstance(params, dict):
            return error_reply(400, "The request body must be a JSON object.", None)
        file_id = params.get("input_file_id")
        if not isinstance(file_id, str) or not file_id:
            return error_reply(
                400,
                "Missing required parameter: 'input_file_id'.",
                "input_file_id",
                "missing_required_parameter",
            )
        for name, allowed in (
            ("endpoint", BATCH_ENDPOINT),
            ("completion_window", COMPLETION_WINDOW),
        ):
            if params.get(name) != allowed:
                message = f"Invalid value: {params.get(name)!r}. Supported values are: '{allowed}'."
                return error_reply(400, message, name, "invalid_value")
        metadata = params.get("metadata")
        problem = _metadata_problem(metadata)
        if problem is not None:
            return error_reply(400, problem, "metadata", "invalid_value")
        stored = self._files.get(file_id)
        if stored is None:
            message = f"Invalid 'input_file_id': '{file_id}'. File with ID '{file_id}' not found."
            return error_reply(400, message, "input_file_id")
        if stored.purpose != "batch":
            message = (
                f"Invalid 'input_file_id': '{file_id}' has purpose '{stored.purpose}'; the "
                "Batch API needs a file with purpose 'batch'."
            )
            return error_reply(400, message, "input_file_id")
        limit = cfg.batch_max_in_progress
        if limit is not None and len(self._active) >= limit:
            message = (
                f"Too many batches in progress: the limit is {limit}. Please try again once "
                "some batches have completed."
            )
            return Reply(429, error_body(message, "requests", None, "rate_limit_exceeded"))
        seq = next(self._seq)
        created_at = self.wall(now)
        batch = _Batch(
            id=new_id("batch_"),
            input_file_id=file_id,
            data=stored.data,
            metadata=dict(metadata) if metadata is not None else None,
            config=cfg,
            rng=random.Random(f"batch:{cfg.faults_seed}:{seq}"),
            due=now + cfg.batch_validating_s,
            stamps={"created_at": created_at, "expires_at": created_at + _WINDOW_S},
        )
        self._batches[batch.id] = batch
        self._active.append(batch)
        return json_reply(batch.to_object())

    def _listing(self, query: dict[str, list[str]]) -> Reply:
        limit = query_int(query, "limit", 20, 100)
        if isinstance(limit, Reply):
            return limit
        items = [b.to_object() for b in reversed(self._batches.values())]
        return json_reply(page(items, limit, query.get("after", [None])[-1]))

    def _cancel(self, batch: _Batch, now: float) -> Reply:
        if batch.status in ("cancelling", "cancelled"):
            return json_reply(batch.to_object())
        if batch.status in TERMINAL:
            message = f"Cannot cancel a batch with status '{batch.status}'."
            return error_reply(409, message, None)
        batch.status = "cancelling"
        batch.stamps["cancelling_at"] = self.wall(now)
        batch.due = now + batch.config.batch_finalizing_s
        return json_reply(batch.to_object())

    # -- time ----------------------------------------------------------------------------

    def advance(self, cfg: SimConfig, now: float) -> bool:
        """Bring every batch up to ``now``; return whether any is still in flight."""
        with self._lock:
            self._advance(cfg, now)
            return bool(self._active)

    def _advance(self, cfg: SimConfig, now: float) -> None:
        # Phase ends are taken in time order, so one batch's end frees its enqueued tokens
        # before a later validation counts them, however late this call comes.
        while True:
            ready = [b for b in self._active if b.due <= now]
            if not ready:
                break
            self._end_phase(min(ready, key=lambda b: b.due), cfg)
        for batch in self._active:
            if batch.status == "in_progress":
                self._run_lines(batch, now)

    def _end_phase(self, batch: _Batch, cfg: SimConfig) -> None:
        at = batch.due
        if batch.status == "validating":
            self._validate(batch, cfg)
        elif batch.status == "in_progress":
            self._run_lines(batch, at)
            assert batch.plan is not None
            if batch.plan.expires:
                self._finish(batch, "expired", at)
            else:
                batch.status = "finalizing"
                batch.stamps["finalizing_at"] = self.wall(at)
                batch.due = at + batch.config.batch_finalizing_s
        elif batch.status == "finalizing":
            self._finish(batch, "completed", at)
        elif batch.status == "cancelling":
            self._finish(batch, "cancelled", at)

    def _validate(self, batch: _Batch, cfg: SimConfig) -> None:
        at = batch.due
        lines, errors = parse_input(batch.data, batch.config)
        batch.data = b""
        model = lines[0].body.get("model") if lines else None
        batch.model = model if isinstance(model, str) else None
        tokens = sum(line.tokens for line in lines)
        limit = cfg.batch_token_limit
        if not errors and limit is not None:
            held = sum(
                b.enqueued for b in self._active if b.status in _ENQUEUED and b.model == batch.model
            )
            if held + tokens > limit:
                message = (
                    f"Enqueued token limit reached for {batch.model} in organization "
                    f"org-simulator. Limit: {limit:,} enqueued tokens. Please try again once "
                    "some in_progress batches have been completed."
                )
                errors = [line_error("token_limit_exceeded", message)]
        if errors:
            batch.errors = errors
            self._finish(batch, "failed", at)
            return
        batch.lines = lines
        batch.total = len(lines)
        batch.enqueued = tokens
        batch.plan = make_plan(len(lines), batch.config, batch.rng)
        batch.status = "in_progress"
        batch.stamps["in_progress_at"] = self.wall(at)
        batch.started = at
        batch.due = at + batch.config.batch_delay_s

    def _run_lines(self, batch: _Batch, now: float) -> None:
        """Process the lines due by ``now``: a steady share of the in-progress window."""
        plan = batch.plan
        assert plan is not None
        if now >= batch.due:
            target = plan.finish
        else:
            share = (now - batch.started) / (batch.due - batch.started)
            target = min(plan.finish, math.floor(len(plan.order) * share))
        for index in plan.order[batch.done : target]:
            self._process(batch, batch.lines[index], plan.fates[index], now)
        batch.done = max(batch.done, target)

    def _process(self, batch: _Batch, line: BatchLine, fate: LineFate, now: float) -> None:
        status, body, (prompt, completion) = self._engine.answer_line(
            batch.config,
            line.body,
            batch_id=batch.id,
            custom_id=line.custom_id,
            fail_status=fate.fail_status,
            cut=fate.cut,
            refuse=fate.refuse,
            now=now,
        )
        record = {
            "id": new_id("batch_req_"),
            "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": new_id("req_"), "body": body},
            "error": None,
        }
        if status == 200:
            batch.output.append(orjson.dumps(record))
            batch.completed += 1
            batch.input_tokens += prompt
            batch.output_tokens += completion
        else:
            batch.failures.append(orjson.dumps(record))
            batch.failed += 1

    def _finish(self, batch: _Batch, status: str, at: float) -> None:
        """End a batch: report unfinished lines, write its files, leave the active list."""
        if status in _UNFINISHED and batch.plan is not None:
            code, message = _UNFINISHED[status]
            for index in batch.plan.order[batch.done :]:
                record = {
                    "id": new_id("batch_req_"),
                    "custom_id": batch.lines[index].custom_id,
                    "response": None,
                    "error": {"code": code, "message": message},
                }
                batch.failures.append(orjson.dumps(record))
                batch.failed += 1
            batch.done = len(batch.plan.order)
        wall = self.wall(at)
        if batch.output:
            name = f"{batch.id}_output.jsonl"
            batch.output_file_id = self._write(name, batch.output, wall)
        if batch.failures:
            name = f"{batch.id}_error.jsonl"
            batch.error_file_id = self._write(name, batch.failures, wall)
        batch.output, batch.failures, batch.lines, batch.data = [], [], [], b""
        batch.status = status
        batch.stamps[f"{status}_at"] = wall
        self._active.remove(batch)

    def _write(self, name: str, lines: list[bytes], wall: int) -> str:
        data = b"".join(line + b"\n" for line in lines)
        return self._files.add(name, "batch_output", data, wall).id

    # -- inspection ------------------------------------------------------------------------

    def objects(self) -> list[dict[str, Any]]:
        """Every batch as the API shows it, in creation order."""
        with self._lock:
            return [b.to_object() for b in self._batches.values()]
