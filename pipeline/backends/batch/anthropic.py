"""Anthropic's Message Batches as the driver's ``BatchAPI``: the same rounds, ledger and
crash guarantees as OpenAI's Batch API, at half price (cache reads and writes included).

Message Batches take their requests inline and have no files and no metadata, so this
side keeps the protocol's shape by standing in for them:

- **The input file** a round's lines would be uploaded as stays in this process: ``upload``
  turns each line (the OpenAI-shaped body the driver builds, ``lines.request_body``) into
  Messages params (``client.anthropic.messages``: the system prompt as blocks, cache
  breakpoints, the format ladder's level read back from ``response_format``) and keeps
  them under a name made from the intent's token; ``create`` sends them. A run stopped
  between the two forgets the intent as it would an uploaded file (nothing to delete).
- **The output file** of an ended batch is its ``results_url``: ``content`` reads each
  result into a line the driver reads (``lines.read_result``): a succeeded request's
  answer already read (``answer``: text, finish reason, usage with cache writes), an
  errored one's status from its error type, a canceled or expired one as never run.
- **The token** of a batch's intent is in every ``custom_id`` (``lines.custom_id``), not
  in metadata. A listing reads it from the first result of each ended batch; a batch still
  in progress cannot show its requests, so it is listed as ``opaque``: ``find_by_token``
  does not take "not found" for an answer while one created since the intent is opaque,
  and the run waits for it to end rather than send its calls again (docs/backends.md).

Results are kept 29 days; a batch takes at most 100,000 requests and 256 MB (the driver's
defaults stay below both).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any, Final

import httpx2
import orjson

from ...client.anthropic.client import api_root, headers_for
from ...client.anthropic.messages import error_of, messages_body, read_message
from ...client.formats import LEVELS
from ...client.models import ModelId
from ...client.reach import PREFLIGHT_S, unreachable, unreachable_error
from ...client.retry import classify_status
from ...errors import AuthError, CallError
from .api import LIST_PAGE, TOKEN_KEY, BatchInfo, FileInfo
from .lines import line_index

__all__ = ["RESULTS_PREFIX", "AnthropicBatchAPI", "line_params"]

PATH: Final = "/v1/messages/batches"
RESULTS_PREFIX: Final = "results:"  # an ended batch's results, as the driver's output file
_INLINE: Final = "inline:"  # a round's requests kept in this process, as its input file
# The status each error type of a result stands for (the retry policy decides by status).
_STATUS: Final = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}
# Anthropic's states as the driver knows them (OpenAI's words).
_STATES: Final = {"in_progress": "in_progress", "canceling": "cancelling", "ended": "completed"}


def line_params(body: Mapping[str, Any], ttl: str | None) -> dict[str, Any]:
    """The Messages params of one OpenAI-shaped line body (``lines.request_body``): the
    schema and level its ``response_format`` names (none: plain text, already spelled
    out in the messages), the model without its ``anthropic:`` prefix."""
    fmt = body.get("response_format")
    schema: Any = None
    level = LEVELS.index("text")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema, level = fmt["json_schema"]["schema"], LEVELS.index("json_schema")
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        schema, level = fmt.get("schema"), LEVELS.index("json_object")
    return messages_body(
        ModelId.parse(str(body["model"])).name,
        body["messages"],
        temperature=float(body.get("temperature", 1.0)),
        max_tokens=int(body["max_tokens"]),
        schema=schema,
        level=level,
        ttl=ttl,
    )


def _when(stamp: Any) -> int:
    """An RFC 3339 time as Unix seconds (0 when absent or unreadable)."""
    if not isinstance(stamp, str):
        return 0
    try:
        return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0


class AnthropicBatchAPI:
    """Message Batches at one Anthropic endpoint, in the shape of ``api.BatchAPI``."""

    def __init__(
        self, base_url: str | None, api_key: str | None, timeout: float, ttl: str | None
    ) -> None:
        self._root = api_root(base_url)
        self._headers = headers_for(api_key)
        self._secret = api_key
        self._ttl = ttl
        self._http = httpx2.AsyncClient(timeout=timeout)
        self._inline: dict[str, bytes] = {}  # a round's requests, by their stand-in file id
        self.requests: Counter[str] = Counter()  # requests sent, by method

    async def _call(
        self, method: str, verb: str, path: str, body: bytes | None = None
    ) -> httpx2.Response:
        """One request; its failure as the package's errors (AuthError for 401/403)."""
        self.requests[method] += 1
        url = path if path.startswith("http") else f"{self._root}{path}"
        try:
            raw = await self._http.request(verb, url, content=body, headers=self._headers)
        except httpx2.TimeoutException as err:
            raise CallError("timeout", f"{method}: no answer in time") from err
        except httpx2.HTTPError as err:
            why = unreachable(err) or type(err).__name__
            raise CallError("connection", f"{method}: connection failed: {why}") from err
        if raw.status_code >= 400:
            try:
                _, message = error_of(orjson.loads(raw.content))
            except orjson.JSONDecodeError:
                message = None
            text = f"{method}: HTTP {raw.status_code}: {message or raw.reason_phrase}"
            if self._secret:
                text = text.replace(self._secret, "***")
            if classify_status(raw.status_code) == "auth":
                raise AuthError("auth", text, status=raw.status_code)
            raise CallError(f"http_{raw.status_code}", text, status=raw.status_code)
        return raw

    def _info(self, data: Mapping[str, Any], token: str | None = None) -> BatchInfo:
        """The driver's view of a MessageBatch (its token, where known)."""
        ended = data.get("processing_status") == "ended"
        batch_id = str(data["id"])
        url = data.get("results_url")
        if not isinstance(url, str) or not url.startswith(self._root + "/"):
            url = f"{self._root}{PATH}/{batch_id}/results"  # the key goes to our endpoint only
        return BatchInfo(
            id=batch_id,
            status=_STATES.get(str(data.get("processing_status")), "in_progress"),
            created_at=_when(data.get("created_at")),
            ended_at=_when(data.get("ended_at")) or None,
            output_file_id=f"{RESULTS_PREFIX}{url}" if ended else None,
            metadata={TOKEN_KEY: token} if token else {},
            opaque=not ended and token is None,
        )

    async def upload(self, name: str, data: bytes) -> str:
        """Keep a round's requests (no request is sent); the id ``create`` takes."""
        requests = []
        for raw in data.splitlines():
            line = orjson.loads(raw)
            params = line_params(line["body"], self._ttl)
            requests.append({"custom_id": line["custom_id"], "params": params})
        file_id = f"{_INLINE}{name}:{uuid.uuid4().hex[:8]}"
        self._inline[file_id] = orjson.dumps({"requests": requests})
        return file_id

    async def create(self, file_id: str, metadata: Mapping[str, str]) -> BatchInfo:
        """Create a Message Batch of the requests kept under ``file_id``."""
        payload = self._inline.get(file_id)
        if payload is None:  # kept by a process that has ended: never sent
            raise CallError("http_404", f"create: {file_id} is not kept here", status=404)
        raw = await self._call("create", "POST", PATH, payload)
        return self._info(orjson.loads(raw.content), metadata.get(TOKEN_KEY))

    async def retrieve(self, batch_id: str) -> BatchInfo:
        """The batch's current state."""
        raw = await self._call("retrieve", "GET", f"{PATH}/{batch_id}")
        return self._info(orjson.loads(raw.content))

    async def listing(self) -> AsyncIterator[BatchInfo]:
        """Every batch, newest first; an ended one with its token (from its first result),
        one in progress opaque."""
        after: str | None = None
        while True:
            query = f"?limit={LIST_PAGE}" + (f"&after_id={after}" if after else "")
            page = orjson.loads((await self._call("list", "GET", PATH + query)).content)
            data = page.get("data") or []
            for item in data:
                info = self._info(item)
                if info.output_file_id is not None:
                    results = info.output_file_id.removeprefix(RESULTS_PREFIX)
                    info = self._info(item, await self._token(results))
                yield info
            if not data or not page.get("has_more") or data[-1]["id"] == after:
                return
            after = str(data[-1]["id"])

    async def _token(self, results_url: str) -> str | None:
        """The intent token in the custom_ids of an ended batch's results (None: not ours,
        or its results are gone)."""
        try:
            raw = await self._call("content", "GET", results_url)
        except CallError as err:
            if err.status == 404:
                return None
            raise
        for line in raw.content.splitlines()[:1]:
            cid = orjson.loads(line).get("custom_id")
            head = str(cid).rpartition("-")[0] if isinstance(cid, str) else ""
            if head and line_index(cid, head) is not None:
                return head
        return None

    async def file_listing(self) -> AsyncIterator[FileInfo]:
        """No files: a round's requests are never uploaded."""
        for _ in ():
            yield FileInfo("", "", None)

    async def cancel(self, batch_id: str) -> BatchInfo:
        """Ask for the batch to be cancelled (one that has ended: its state, unchanged)."""
        try:
            raw = await self._call("cancel", "POST", f"{PATH}/{batch_id}/cancel")
        except CallError as err:
            if err.status != 400:
                raise
            info = await self.retrieve(batch_id)
            if info.status != "completed":  # refused for another reason than its end
                raise
            return info
        return self._info(orjson.loads(raw.content))

    async def content(self, file_id: str) -> bytes:
        """An ended batch's results (from its ``results_url``), as lines the driver reads
        (``lines.read_result``)."""
        raw = await self._call("content", "GET", file_id.removeprefix(RESULTS_PREFIX))
        out = []
        for line in raw.content.splitlines():
            if line.strip():
                out.append(orjson.dumps(self._line(orjson.loads(line))))
        return b"\n".join(out)

    def _line(self, result: Mapping[str, Any]) -> dict[str, Any]:
        """One result as the driver's line: an answer read, an error status, or never run."""
        cid = result.get("custom_id")
        got = result.get("result") or {}
        kind = got.get("type")
        if kind == "succeeded":
            try:
                answer = read_message(got.get("message"), self._ttl)
            except CallError as err:
                return {"custom_id": cid, "failed": {"category": err.category, "message": str(err)}}
            return {"custom_id": cid, "answer": answer}
        if kind == "errored":
            error_type, message = error_of(got.get("error"))
            status = _STATUS.get(error_type or "", 500)
            body = {"error": {"message": message or error_type or "errored"}}
            return {"custom_id": cid, "response": {"status_code": status, "body": body}}
        unfinished = "batch_cancelled" if kind == "canceled" else "batch_expired"
        return {"custom_id": cid, "error": {"code": unfinished, "message": str(kind)}}

    async def delete(self, file_id: str) -> None:
        """Forget a round's kept requests (results are Anthropic's to expire)."""
        self._inline.pop(file_id, None)

    async def preflight(self, timeout: float = PREFLIGHT_S) -> None:
        """Raise UnreachableError when the endpoint cannot be reached at all."""
        try:
            await self._http.get(f"{self._root}/v1/models", headers=self._headers, timeout=timeout)
        except httpx2.HTTPError as err:
            why = unreachable(err)
            if why is not None:
                raise unreachable_error(self._root, why) from err

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()
