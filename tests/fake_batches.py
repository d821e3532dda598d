"""An in-memory Batch API (files and batches) for the driver's tests, and a fake clock.

Batches move on when they are looked at, not with time: each ``retrieve`` takes a batch
one phase further (validating, in progress, then its end), so tests need no sleeps. What
happens to each batch and line is decided by functions the test passes.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.backends.batch.api import BatchInfo, BatchIssue, FileInfo
from pipeline.errors import AuthError, CallError

Body = dict[str, Any]


def answer_text(body: Mapping[str, Any]) -> str:
    """A deterministic answer to a chat request: feedback JSON when a format is asked, else code."""
    digest = hashlib.sha256(orjson.dumps(body["messages"])).hexdigest()[:8]
    fmt = body.get("response_format") or {}
    schema = fmt.get("json_schema", {}).get("schema") or fmt.get("schema")
    if schema is None:
        return f"```python\ndef f_{digest}(xs):\n    return sum(xs)\n```\nSums the list."
    values = {"string": "fine", "integer": 5, "number": 5.0, "boolean": False}
    out: dict[str, Any] = {}
    for name, prop in schema.get("properties", {}).items():
        type_ = prop.get("type")
        out[name] = [f"rename xs to values ({digest})"] if type_ == "array" else values.get(type_)
    return orjson.dumps(out).decode()


def completion(body: Mapping[str, Any]) -> Body:
    """The chat completion object answering ``body``."""
    text = answer_text(body)
    prompt = sum(len(m["content"]) for m in body["messages"]) // 4
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": len(text) // 4},
    }


@dataclass(slots=True)
class _Batch:
    id: str
    seq: int
    input_file_id: str
    metadata: dict[str, str]
    lines: list[Body]
    status: str = "validating"
    looks: int = 0
    info: BatchInfo | None = None


@dataclass(slots=True)
class FakeBatchAPI:
    """Files and batches in memory; every request is logged in ``requests``.

    ``fate(seq)`` is how the batch with creation number ``seq`` ends: ``completed``,
    ``expired`` (after ``done_fraction`` of its lines), ``failed`` (its issues from
    ``issues(seq)``) or ``completed_empty`` (completed, but no line in any file).
    ``line_status(custom_id, body)`` is the HTTP status a line is answered with.
    """

    fate: Callable[[int], str] = lambda seq: "completed"
    line_status: Callable[[str, Body], int] = lambda cid, body: 200
    issues: Callable[[int], tuple[BatchIssue, ...]] = lambda seq: ()
    error_message: Callable[[int, Body], str] = lambda status, body: f"failed with {status}"
    looks_to_end: int = 2  # retrieves before a batch ends
    done_fraction: float = 0.5
    refuse_creates: int = 0  # the first N creates are answered 429
    lose_create_answers: int = 0  # the first N creates happen, but their answer is lost
    lose_upload_answers: int = 0  # the first N uploads happen, but their answer is lost
    auth_fails: bool = False
    delete_status: int | None = None  # answer every delete with this error status
    shuffle: bool = True
    seed: int = 0
    files: dict[str, bytes] = field(default_factory=dict)
    batches: dict[str, _Batch] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)
    processed: list[str] = field(default_factory=list)  # custom_ids run, in order
    deleted: list[str] = field(default_factory=list)
    uploads: list[bytes] = field(default_factory=list)  # every input file uploaded
    names: dict[str, str] = field(default_factory=dict)  # input file id -> name, in upload order
    bodies: list[Body] = field(default_factory=list)  # request bodies of the lines run
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _seq: Any = field(default_factory=itertools.count)

    def _request(self, method: str) -> None:
        self.requests[method] += 1
        if self.auth_fails:
            raise AuthError("auth", f"{method}: HTTP 401: bad key", status=401)

    def _new_file(self, prefix: str, data: bytes) -> str:
        file_id = f"{prefix}-{next(self._ids)}"
        self.files[file_id] = data
        return file_id

    async def upload(self, name: str, data: bytes) -> str:
        self._request("upload")
        self.uploads.append(data)
        file_id = self._new_file("file", data)
        self.names[file_id] = name
        if self.lose_upload_answers > 0:
            self.lose_upload_answers -= 1
            raise CallError("timeout", "upload: no answer in time")
        return file_id

    async def create(self, file_id: str, metadata: Mapping[str, str]) -> BatchInfo:
        self._request("create")
        if self.refuse_creates > 0:
            self.refuse_creates -= 1
            raise CallError("http_429", "create: HTTP 429: too many batches", status=429)
        if file_id not in self.files:
            raise CallError("http_400", f"create: HTTP 400: no file {file_id}", status=400)
        lines = [orjson.loads(raw) for raw in self.files[file_id].splitlines() if raw.strip()]
        seq = next(self._seq)
        batch = _Batch(f"batch_{seq}", seq, file_id, dict(metadata), lines)
        self.batches[batch.id] = batch
        if self.lose_create_answers > 0:
            self.lose_create_answers -= 1
            raise CallError("timeout", "create: no answer in time")
        return self._info(batch)

    def _info(self, batch: _Batch) -> BatchInfo:
        if batch.info is not None:
            return batch.info
        return BatchInfo(
            batch.id,
            batch.status,
            created_at=1_700_000_000 + batch.seq,
            input_file_id=batch.input_file_id,
            metadata=batch.metadata,
        )

    async def retrieve(self, batch_id: str) -> BatchInfo:
        self._request("retrieve")
        batch = self.batches.get(batch_id)
        if batch is None:
            raise CallError("http_404", "retrieve: HTTP 404", status=404)
        if batch.info is None:
            batch.looks += 1
            if batch.looks >= self.looks_to_end:
                self._end(batch, self.fate(batch.seq))
            elif batch.status == "validating":
                batch.status = "in_progress"
        return self._info(batch)

    def _end(self, batch: _Batch, fate: str) -> None:
        ended = 1_700_000_100 + batch.seq
        if fate == "failed":
            batch.info = BatchInfo(
                batch.id, "failed", 1_700_000_000, ended, batch.input_file_id,
                errors=self.issues(batch.seq), metadata=batch.metadata,
            )  # fmt: skip
            return
        order = list(range(len(batch.lines)))
        if self.shuffle:
            random.Random(f"{self.seed}:{batch.seq}").shuffle(order)
        partial = fate in ("expired", "cancelled")
        run = order[: int(len(order) * self.done_fraction)] if partial else order
        out, err = [], []
        for i in run:
            line = batch.lines[i]
            cid, body = line["custom_id"], line["body"]
            self.processed.append(cid)
            self.bodies.append(body)
            status = self.line_status(cid, body)
            if status == 200:
                response = {"status_code": 200, "body": completion(body)}
                out.append({"id": f"req-{cid}", "custom_id": cid, "response": response})
            else:
                message = self.error_message(status, body)
                error = {"error": {"message": message, "type": "x"}}
                response = {"status_code": status, "body": error}
                err.append({"id": f"req-{cid}", "custom_id": cid, "response": response})
        code = "batch_expired" if fate == "expired" else "batch_cancelled"
        for i in order[len(run) :]:
            unfinished = {"code": code, "message": "not run"}
            cid = batch.lines[i]["custom_id"]
            err.append(
                {"id": f"req-{cid}", "custom_id": cid, "response": None, "error": unfinished}
            )
        if fate == "completed_empty":
            out, err, fate = [], [], "completed"

        def file(lines: list[Body], purpose: str) -> str | None:
            if not lines:
                return None
            return self._new_file(purpose, b"".join(orjson.dumps(x) + b"\n" for x in lines))

        batch.info = BatchInfo(
            batch.id,
            fate,
            1_700_000_000,
            ended,
            batch.input_file_id,
            file(out, "output"),
            file(err, "error"),
            metadata=batch.metadata,
        )

    async def listing(self) -> AsyncIterator[BatchInfo]:
        self._request("list")
        for batch in reversed(list(self.batches.values())):
            yield self._info(batch)

    async def file_listing(self) -> AsyncIterator[FileInfo]:
        self._request("list_files")
        for file_id, name in reversed(list(self.names.items())):
            if file_id in self.files:
                yield FileInfo(file_id, name, None)

    async def cancel(self, batch_id: str) -> BatchInfo:
        self._request("cancel")
        batch = self.batches[batch_id]
        if batch.info is not None:
            raise CallError("http_409", "cancel: HTTP 409: ended", status=409)
        self._end(batch, "cancelled")
        return self._info(batch)

    async def content(self, file_id: str) -> bytes:
        self._request("content")
        return self.files[file_id]

    async def delete(self, file_id: str) -> None:
        self._request("delete")
        if self.delete_status is not None:
            status = self.delete_status
            raise CallError(f"http_{status}", f"delete: HTTP {status}", status=status)
        if self.files.pop(file_id, None) is not None:
            self.deleted.append(file_id)

    async def aclose(self) -> None:
        return None


class FakeClock:
    """A clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
