"""The Files API: uploads (multipart/form-data), metadata, content, deletion, listing."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qs

from .replies import Reply, error_reply, json_reply, new_id, page, query_int

__all__ = [
    "FILE_PURPOSES",
    "MAX_UPLOAD_BYTES",
    "FileStore",
    "FormPart",
    "MultipartError",
    "StoredFile",
    "parse_multipart",
]

FILE_PURPOSES: Final = frozenset(
    {"assistants", "batch", "fine-tune", "vision", "user_data", "evals"}
)
# OpenAI takes uploads up to 512 MB; the Batch API then refuses inputs over its own limit.
MAX_UPLOAD_BYTES: Final = 512 * 1024 * 1024
_BATCH_FILE_TTL_S: Final = 30 * 24 * 3600


class MultipartError(ValueError):
    """A multipart/form-data body that cannot be read."""


@dataclass(frozen=True, slots=True)
class FormPart:
    """One field of a multipart/form-data body."""

    name: str
    data: bytes
    filename: str | None = None


def _boundary(content_type: str) -> bytes:
    media_type, _, params = content_type.partition(";")
    if media_type.strip().lower() != "multipart/form-data":
        raise MultipartError("expected a multipart/form-data body")
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key.lower() == "boundary" and value:
            return value.strip('"').encode("latin-1")
    raise MultipartError("the multipart/form-data content type has no boundary")


def _disposition(head: bytes) -> tuple[str, str | None]:
    """The ``name`` and ``filename`` of a part's Content-Disposition header."""
    for line in head.decode("utf-8", "replace").split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() != "content-disposition":
            continue
        params: dict[str, str] = {}
        for item in value.split(";")[1:]:
            k, _, v = item.strip().partition("=")
            params[k.lower()] = v.strip('"')
        if "name" in params:
            return params["name"], params.get("filename")
    raise MultipartError("a part has no Content-Disposition name")


def parse_multipart(content_type: str, body: bytes) -> dict[str, FormPart]:
    """The fields of a multipart/form-data ``body``, by name (the last of a repeated name)."""
    delimiter = b"--" + _boundary(content_type)
    start = body.find(delimiter)
    if start < 0:
        raise MultipartError("the body does not contain the boundary")
    parts: dict[str, FormPart] = {}
    pos = start + len(delimiter)
    while True:
        if body.startswith(b"--", pos):
            return parts
        if not body.startswith(b"\r\n", pos):
            raise MultipartError("malformed boundary line")
        head_end = body.find(b"\r\n\r\n", pos + 2)
        if head_end < 0:
            raise MultipartError("a part's headers do not end")
        end = body.find(b"\r\n" + delimiter, head_end + 4)
        if end < 0:
            raise MultipartError("the body ends before its closing boundary")
        name, filename = _disposition(body[pos + 2 : head_end])
        parts[name] = FormPart(name, body[head_end + 4 : end], filename)
        pos = end + 2 + len(delimiter)


@dataclass(frozen=True, slots=True)
class StoredFile:
    """An uploaded (or batch-produced) file."""

    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int

    def to_object(self) -> dict[str, Any]:
        """The API's FileObject."""
        ttl = self.purpose in ("batch", "batch_output")
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "expires_at": self.created_at + _BATCH_FILE_TTL_S if ttl else None,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def _not_found(file_id: str) -> Reply:
    return error_reply(404, f"No such File object: {file_id}", "id")


class FileStore:
    """The files held in memory, in upload order; the HTTP routes under ``/v1/files``."""

    def __init__(self) -> None:
        self._files: dict[str, StoredFile] = {}
        # Batches add files on the server thread while tests may read from another.
        self._lock = threading.Lock()

    def add(self, filename: str, purpose: str, data: bytes, created_at: int) -> StoredFile:
        """Store a file; return it."""
        stored = StoredFile(new_id("file-"), filename, purpose, data, created_at)
        with self._lock:
            self._files[stored.id] = stored
        return stored

    def get(self, file_id: str) -> StoredFile | None:
        """The file with this id, if it exists."""
        with self._lock:
            return self._files.get(file_id)

    def objects(self) -> list[dict[str, Any]]:
        """Every file held, as the API shows it, in upload order."""
        with self._lock:
            return [f.to_object() for f in self._files.values()]

    def handle(
        self, method: str, path: str, query: str, headers: dict[str, str], body: bytes, wall: int
    ) -> Reply:
        """Route a request under ``/v1/files`` (``path`` without a trailing slash)."""
        rest = path[len("/v1/files") :].lstrip("/")
        file_id, _, sub = rest.partition("/")
        if not file_id:
            if method == "POST":
                return self.upload(headers.get("content-type", ""), body, wall)
            if method == "GET":
                return self.listing(parse_qs(query))
        elif sub == "" and method == "GET":
            stored = self.get(file_id)
            return json_reply(stored.to_object()) if stored else _not_found(file_id)
        elif sub == "" and method == "DELETE":
            with self._lock:
                gone = self._files.pop(file_id, None)
            if gone is None:
                return _not_found(file_id)
            return json_reply({"id": file_id, "object": "file", "deleted": True})
        elif sub == "content" and method == "GET":
            stored = self.get(file_id)
            if stored is None:
                return _not_found(file_id)
            return Reply(200, stored.data, content_type="application/octet-stream")
        return error_reply(404, f"Invalid URL ({method} {path})", None, "unknown_url")

    def upload(self, content_type: str, body: bytes, wall: int) -> Reply:
        """``POST /v1/files``: store the ``file`` field under its ``purpose``."""
        try:
            form = parse_multipart(content_type, body)
        except MultipartError as err:
            return error_reply(400, f"Could not parse the multipart form: {err}.", None)
        purpose_part = form.get("purpose")
        file_part = form.get("file")
        if purpose_part is None:
            return error_reply(
                400,
                "Missing required parameter: 'purpose'.",
                "purpose",
                "missing_required_parameter",
            )
        if file_part is None or file_part.filename is None:
            return error_reply(
                400, "Missing required parameter: 'file'.", "file", "missing_required_parameter"
            )
        purpose = purpose_part.data.decode("utf-8", "replace")
        if purpose not in FILE_PURPOSES:
            message = f"'{purpose}' is not one of {sorted(FILE_PURPOSES)} - 'purpose'"
            return error_reply(400, message, "purpose", "invalid_value")
        if purpose == "batch" and not file_part.filename.endswith(".jsonl"):
            return error_reply(400, "Invalid file format for Batch API. Must be .jsonl", "file")
        stored = self.add(file_part.filename, purpose, file_part.data, wall)
        return json_reply(stored.to_object())

    def listing(self, query: dict[str, list[str]]) -> Reply:
        """``GET /v1/files``: by ``order`` of creation (newest first by default)."""
        limit = query_int(query, "limit", 10_000, 10_000)
        if isinstance(limit, Reply):
            return limit
        purpose = query.get("purpose", [None])[-1]
        with self._lock:
            items = [f.to_object() for f in self._files.values()]
        if purpose is not None:
            items = [item for item in items if item["purpose"] == purpose]
        if query.get("order", ["desc"])[-1] != "asc":
            items.reverse()
        return json_reply(page(items, limit, query.get("after", [None])[-1]))
