"""Message Batches: batches of Messages API requests, run in scaled time.

A batch is created from ``requests`` (``custom_id`` and ``params`` each); the envelope is
checked at once (400 for a missing or malformed ``custom_id``, a duplicate one, more than
``message_batch_max_requests`` requests; bodies over ``message_batch_max_bytes`` are
refused with 413 before they are read), each request's ``params`` only when it runs (an
invalid one ends ``errored``, as Anthropic validates them asynchronously).

A batch is ``in_progress`` for ``batch_delay_s``, its requests finishing steadily over that
window (in shuffled order unless ``batch_shuffle`` is off), then ``ended`` with its
``results_url``. ``request_counts`` shows every request as ``processing`` until the batch
ends, then ``succeeded``, ``errored``, ``canceled`` and ``expired``. A share of requests
errors (``p_line_fail``, with a status from ``line_fail_statuses`` and its Anthropic error
type); an expiring batch (``p_batch_expire``) finishes ``expire_fraction`` of its requests,
then ends with the rest ``expired``. A canceled batch is ``canceling`` for
``batch_finalizing_s``, then ends with the requests not yet run ``canceled``. Results stay
29 days after creation (then 404, ``archived_at`` set); ``expires_at`` is creation plus 24
hours. Decisions are drawn from ``faults_seed`` and the batch's sequence number, like the
Batch API's (``batch_input.make_plan``).

Every request is answered by ``MessagesEngine.answer_line`` (the real-time answer without
the real-time limits and transport faults) and billed at the batch rate.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import parse_qs

import orjson

from ..batch_input import BatchPlan, make_plan
from ..config import SimConfig
from ..replies import Reply
from .errors import error_reply, new_id
from .messages import MessagesEngine

__all__ = ["RESULTS_KEPT_S", "MessageBatchStore"]

PATH: Final = "/v1/messages/batches"
RESULTS_KEPT_S: Final = 29 * 24 * 3600
_WINDOW_S: Final = 24 * 3600
_CUSTOM_ID: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_LIST_LIMIT: Final = 1000


def _stamp(wall: float | None) -> str | None:
    """A Unix time as RFC 3339 in UTC (None stays None)."""
    if wall is None:
        return None
    return datetime.fromtimestamp(wall, UTC).isoformat().replace("+00:00", "Z")


@dataclass(slots=True)
class _MessageBatch:
    """One batch's state, on the server clock; ``due`` ends its current phase."""

    id: str
    requests: list[tuple[str, dict[str, Any]]]
    config: SimConfig
    plan: BatchPlan
    created: float
    due: float
    status: str = "in_progress"
    done: int = 0
    canceled_at: float | None = None
    ended: float | None = None
    results: list[bytes] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def to_object(self, wall0: float, base: str, now: float) -> dict[str, Any]:
        """The API's MessageBatch object."""
        ended = self.ended is not None
        # Requests stay "processing" until the whole batch ends (as Anthropic counts them).
        results = ("succeeded", "errored", "canceled", "expired")
        counts = {k: self.counts.get(k, 0) if ended else 0 for k in results}
        archived = self.created + RESULTS_KEPT_S
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.status,
            "request_counts": {"processing": 0 if ended else len(self.requests), **counts},
            "created_at": _stamp(wall0 + self.created),
            "expires_at": _stamp(wall0 + self.created + _WINDOW_S),
            "ended_at": _stamp(wall0 + self.ended) if self.ended is not None else None,
            "cancel_initiated_at": _stamp(wall0 + self.canceled_at)
            if self.canceled_at is not None
            else None,
            "archived_at": _stamp(wall0 + archived) if now >= archived else None,
            "results_url": f"{base}{PATH}/{self.id}/results" if ended else None,
        }


def _base(headers: dict[str, str]) -> str:
    """The server's own root as the client reached it (``results_url`` points there)."""
    host = headers.get("host")
    return f"http://{host}" if host else ""


class MessageBatchStore:
    """Every Message Batch of this server; the HTTP routes under ``/v1/messages/batches``."""

    def __init__(self, engine: MessagesEngine, wall0: float) -> None:
        """``wall0`` is the Unix time at server-clock zero (for the objects' timestamps)."""
        self._engine = engine
        self._wall0 = wall0
        self._batches: dict[str, _MessageBatch] = {}
        self._active: list[_MessageBatch] = []
        self._seq = itertools.count()
        # Requests and ticks run on the server thread; snapshots may come from another.
        self._lock = threading.Lock()

    # -- HTTP --------------------------------------------------------------------------

    def handle(
        self,
        cfg: SimConfig,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        raw: bytes,
        now: float,
        request_id: str,
    ) -> Reply:
        """Route a request under ``/v1/messages/batches`` (no trailing slash)."""
        rest = path[len(PATH) :].lstrip("/")
        batch_id, _, sub = rest.partition("/")
        base = _base(headers)
        with self._lock:
            self._advance(now)
            if not batch_id:
                if method == "POST":
                    return self._create(cfg, raw, now, base, request_id)
                if method == "GET":
                    return self._listing(parse_qs(query), base, now, request_id)
                return _unknown(method, path, request_id)
            batch = self._batches.get(batch_id)
            if batch is None:
                message = f"message_batch_id: no batch found with id {batch_id!r}"
                return error_reply(404, message, request_id)
            if sub == "" and method == "GET":
                return self._json(batch.to_object(self._wall0, base, now), request_id)
            if sub == "" and method == "DELETE":
                return self._delete(batch, request_id)
            if sub == "cancel" and method == "POST":
                return self._cancel(batch, now, base, request_id)
            if sub == "results" and method == "GET":
                return self._results(batch, now, request_id)
        return _unknown(method, path, request_id)

    @staticmethod
    def _json(value: Any, request_id: str) -> Reply:
        return Reply(200, orjson.dumps(value), [("request-id", request_id)])

    def _create(self, cfg: SimConfig, raw: bytes, now: float, base: str, rid: str) -> Reply:
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            return error_reply(400, "The request body must be a JSON object.", rid)
        extra = set(body) - {"requests"}
        if extra:
            return error_reply(400, f"{sorted(extra)[0]}: Extra inputs are not permitted", rid)
        requests = _requests(body.get("requests"), cfg.message_batch_max_requests)
        if isinstance(requests, str):
            return error_reply(400, requests, rid)
        limit = cfg.batch_max_in_progress
        if limit is not None and len(self._active) >= limit:
            message = f"Too many Message Batches in progress: the limit is {limit}."
            return error_reply(429, message, rid)
        seq = next(self._seq)
        rng = random.Random(f"message-batch:{cfg.faults_seed}:{seq}")
        batch = _MessageBatch(
            id=new_id("msgbatch_"),
            requests=requests,
            config=cfg,
            plan=make_plan(len(requests), cfg, rng),
            created=now,
            due=now + cfg.batch_delay_s,
        )
        self._batches[batch.id] = batch
        self._active.append(batch)
        return self._json(batch.to_object(self._wall0, base, now), rid)

    def _listing(self, query: dict[str, list[str]], base: str, now: float, rid: str) -> Reply:
        raw = query.get("limit", ["20"])[-1]
        limit = int(raw) if raw.isdigit() else 0
        if not 1 <= limit <= _LIST_LIMIT:
            return error_reply(400, f"limit: Input should be between 1 and {_LIST_LIMIT}", rid)
        items = list(reversed(self._batches.values()))  # most recent first
        ids = [b.id for b in items]
        after, before = query.get("after_id", [None])[-1], query.get("before_id", [None])[-1]
        if after is not None:
            items = items[ids.index(after) + 1 :] if after in ids else []
            page = items[:limit]
        elif before is not None:
            items = items[: ids.index(before)] if before in ids else []
            page = items[-limit:]
        else:
            page = items[:limit]
        data = [b.to_object(self._wall0, base, now) for b in page]
        return self._json(
            {
                "data": data,
                "has_more": len(items) > limit,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            },
            rid,
        )

    def _delete(self, batch: _MessageBatch, rid: str) -> Reply:
        if batch.ended is None:
            message = (
                f"Message Batch {batch.id} is still processing; cancel it and wait for it to "
                "end before deleting it."
            )
            return error_reply(400, message, rid)
        del self._batches[batch.id]
        return self._json({"id": batch.id, "type": "message_batch_deleted"}, rid)

    def _cancel(self, batch: _MessageBatch, now: float, base: str, rid: str) -> Reply:
        if batch.status == "in_progress":
            self._run(batch, now)
            batch.status = "canceling"
            batch.canceled_at = now
            batch.due = now + batch.config.batch_finalizing_s
        elif batch.status == "ended":
            return error_reply(400, f"Message Batch {batch.id} has ended: nothing to cancel.", rid)
        return self._json(batch.to_object(self._wall0, base, now), rid)

    def _results(self, batch: _MessageBatch, now: float, rid: str) -> Reply:
        if batch.ended is None:
            message = f"Message Batch {batch.id} has not ended; its results are not ready."
            return error_reply(400, message, rid)
        if now >= batch.created + RESULTS_KEPT_S:
            return error_reply(404, f"The results of Message Batch {batch.id} have expired.", rid)
        data = b"".join(line + b"\n" for line in batch.results)
        headers = [("request-id", rid)]
        return Reply(200, data, headers, content_type="application/binary")

    # -- time ----------------------------------------------------------------------------

    def advance(self, now: float) -> bool:
        """Bring every batch up to ``now``; return whether any is still in flight."""
        with self._lock:
            self._advance(now)
            return bool(self._active)

    def _advance(self, now: float) -> None:
        for batch in list(self._active):
            if batch.status == "in_progress":
                self._run(batch, min(now, batch.due))
            if batch.due <= now:
                unfinished = "expired" if batch.status == "in_progress" else "canceled"
                self._end(batch, unfinished, batch.due)

    def _run(self, batch: _MessageBatch, now: float) -> None:
        """Run the requests due by ``now``: a steady share of the in-progress window."""
        plan = batch.plan
        window = batch.due - batch.created
        share = 1.0 if window <= 0 or now >= batch.due else (now - batch.created) / window
        target = min(plan.finish, math.floor(len(plan.order) * share))
        for index in plan.order[batch.done : target]:
            custom_id, params = batch.requests[index]
            result = self._engine.answer_line(
                batch.config,
                params,
                batch_id=batch.id,
                custom_id=custom_id,
                fate=plan.fates[index],
                now=now,
            )
            outcome = str(result["type"])
            batch.counts[outcome] = batch.counts.get(outcome, 0) + 1
            batch.results.append(orjson.dumps({"custom_id": custom_id, "result": result}))
        batch.done = max(batch.done, target)

    def _end(self, batch: _MessageBatch, unfinished: str, at: float) -> None:
        """End a batch: the requests not run are ``unfinished`` (expired or canceled)."""
        for index in batch.plan.order[batch.done :]:
            custom_id = batch.requests[index][0]
            line = {"custom_id": custom_id, "result": {"type": unfinished}}
            batch.results.append(orjson.dumps(line))
            batch.counts[unfinished] = batch.counts.get(unfinished, 0) + 1
        batch.done = len(batch.plan.order)
        batch.status = "ended"
        batch.ended = at
        self._active.remove(batch)

    # -- inspection ------------------------------------------------------------------------

    def objects(self, base: str, now: float) -> list[dict[str, Any]]:
        """Every batch not deleted, as the API shows it, in creation order."""
        with self._lock:
            return [b.to_object(self._wall0, base, now) for b in self._batches.values()]


def _unknown(method: str, path: str, rid: str) -> Reply:
    return error_reply(404, f"Not found: {method} {path}", rid)


def _requests(value: Any, most: int) -> list[tuple[str, dict[str, Any]]] | str:
    """The ``(custom_id, params)`` pairs of a create body, or the 400 message."""
    if not isinstance(value, list) or not value:
        return "requests: at least one request is required"
    if len(value) > most:
        return f"requests: a Message Batch holds at most {most:,} requests, not {len(value):,}"
    out: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        where = f"requests.{i}"
        if not isinstance(item, dict):
            return f"{where}: Input should be a valid dictionary"
        extra = set(item) - {"custom_id", "params"}
        if extra:
            return f"{where}.{sorted(extra)[0]}: Extra inputs are not permitted"
        custom_id, params = item.get("custom_id"), item.get("params")
        if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
            return f"{where}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
        if custom_id in seen:
            return f"{where}.custom_id: duplicate custom_id {custom_id!r}; each must be unique"
        if not isinstance(params, dict):
            return f"{where}.params: Field required"
        seen.add(custom_id)
        out.append((custom_id, params))
    return out
