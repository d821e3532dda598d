"""The Batch API as the driver sees it: files and batches, one HTTP request a method.

``BatchAPI`` is the protocol (tests pass a fake); ``OpenAIBatchAPI`` speaks to
``/v1/files`` and ``/v1/batches`` through the openai SDK with its own retries off: the
driver is the one retry layer, and tries a failed request again at its next poll (a
``batches.create`` whose outcome is unknown is first looked for by its token, never
blindly repeated). Failures are translated here into the package's errors: 401/403 into
AuthError, everything else into a CallError carrying the status or the failure's category.
``Sides`` holds a run's endpoints by side (generator, critic); ``opening.open_sides`` opens
them, OpenAI's or Anthropic's (``anthropic``) by the model's provider.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

import anyio
import openai

from ...client.reach import PREFLIGHT_S, preflight
from ...client.replies import error_message, redact
from ...client.retry import classify_status
from ...core.steps import Role
from ...errors import AuthError, CallError

__all__ = [
    "ENDPOINT",
    "TERMINAL",
    "TOKEN_KEY",
    "BatchAPI",
    "BatchInfo",
    "BatchIssue",
    "OpenAIBatchAPI",
    "Side",
    "Sides",
    "Undecided",
    "find_by_token",
    "find_upload",
    "input_file_name",
]

ENDPOINT: Final = "/v1/chat/completions"
TOKEN_KEY = "refine_token"  # the batch metadata key holding the token of the batch's intent
# A batch found by listing was created after its intent; clocks may differ by this much.
CLOCK_SKEW_S = 600.0
COMPLETION_WINDOW: Final = "24h"
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
LIST_PAGE = 100  # the most batches one listing request returns
# Uploading or downloading a file of up to 200 MB takes longer than one chat call.
FILE_TIMEOUT_S = 600.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchIssue:
    """One validation error of a failed batch."""

    code: str | None
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.code or 'error'}: {self.message}"


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What the Batch API says about one batch."""

    id: str
    status: str
    created_at: int = 0
    ended_at: int | None = None  # when it completed, failed, expired or was cancelled
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: tuple[BatchIssue, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)
    # Whose it is cannot be told yet (Message Batches: no metadata, requests unreadable
    # until the batch ends): a search by token waits for it rather than say "not found".
    opaque: bool = False

    @property
    def terminal(self) -> bool:
        """Whether the batch has ended (its files, if any, are final)."""
        return self.status in TERMINAL

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> BatchInfo:
        """Read the API's batch object."""
        errors = (data.get("errors") or {}).get("data") or ()
        ended = [data.get(f"{s}_at") for s in ("completed", "failed", "expired", "cancelled")]
        return cls(
            id=str(data["id"]),
            status=str(data["status"]),
            created_at=int(data.get("created_at") or 0),
            ended_at=next((int(t) for t in ended if t), None),
            input_file_id=data.get("input_file_id"),
            output_file_id=data.get("output_file_id"),
            error_file_id=data.get("error_file_id"),
            errors=tuple(
                BatchIssue(e.get("code"), str(e.get("message") or ""), e.get("line"))
                for e in errors
            ),
            metadata=dict(data.get("metadata") or {}),
        )


@dataclass(frozen=True, slots=True)
class FileInfo:
    """An uploaded file as a listing shows it."""

    id: str
    filename: str
    created_at: int | None


class Undecided(CallError):
    """A batch created since an intent may be the intent's but cannot be told yet (it is in
    progress and shows neither metadata nor requests): looked for again later."""

    def __init__(self, batch_id: str) -> None:
        super().__init__(
            "undecided",
            f"batch {batch_id}, created since, is in progress and cannot show whose it is "
            "until it ends",
        )


def input_file_name(token: str) -> str:
    """The name a batch's input file is uploaded under: its intent's token makes it unique."""
    return f"refine-{token}.jsonl"


class BatchAPI(Protocol):
    """Files and batches at one endpoint; every method is one request (or one listing)."""

    async def upload(self, name: str, data: bytes) -> str:
        """Upload a batch input file; its file id."""
        ...

    async def create(self, file_id: str, metadata: Mapping[str, str]) -> BatchInfo:
        """Create a batch of the chat completions in ``file_id``."""
        ...

    async def retrieve(self, batch_id: str) -> BatchInfo:
        """The batch's current state."""
        ...

    def listing(self) -> AsyncIterator[BatchInfo]:
        """Every batch, newest first, page by page."""
        ...

    def file_listing(self) -> AsyncIterator[FileInfo]:
        """Every batch input file, newest first, page by page."""
        ...

    async def cancel(self, batch_id: str) -> BatchInfo:
        """Ask for the batch to be cancelled."""
        ...

    async def content(self, file_id: str) -> bytes:
        """A file's content."""
        ...

    async def delete(self, file_id: str) -> None:
        """Delete a file (one already gone is no error)."""
        ...

    async def aclose(self) -> None:
        """Close the connections."""
        ...


class OpenAIBatchAPI:
    """``/v1/files`` and ``/v1/batches`` of an OpenAI-compatible endpoint."""

    def __init__(self, base_url: str | None, api_key: str | None, timeout: float) -> None:
        self._secret = api_key
        self._sdk = openai.AsyncOpenAI(
            api_key=api_key or "no-key",
            base_url=base_url,
            max_retries=0,  # the driver retries at its next poll
            timeout=timeout,
        )
        self.requests: Counter[str] = Counter()  # requests sent, by method

    async def _call(self, method: str, make: Callable[[], Awaitable[T]]) -> T:
        """Send one request; translate its failure into the package's errors."""
        self.requests[method] += 1
        try:
            return await make()
        except openai.APIStatusError as err:
            status = err.status_code
            text = f"{method}: HTTP {status}: {redact(error_message(err), self._secret)}"
            if classify_status(status) == "auth":
                raise AuthError("auth", text, status=status) from err
            raise CallError(f"http_{status}", text, status=status) from err
        except openai.APITimeoutError as err:
            raise CallError("timeout", f"{method}: no answer in time") from err
        except openai.APIConnectionError as err:
            cause = redact(str(err.__cause__ or err), self._secret)
            raise CallError("connection", f"{method}: connection failed: {cause}") from err

    async def upload(self, name: str, data: bytes) -> str:
        """Upload a batch input file; its file id."""
        created = await self._call(
            "upload",
            lambda: self._sdk.files.create(
                file=(name, data, "application/jsonl"), purpose="batch", timeout=FILE_TIMEOUT_S
            ),
        )
        return created.id

    async def create(self, file_id: str, metadata: Mapping[str, str]) -> BatchInfo:
        """Create a batch of the chat completions in ``file_id``."""
        batch = await self._call(
            "create",
            lambda: self._sdk.batches.create(
                input_file_id=file_id,
                endpoint=ENDPOINT,
                completion_window=COMPLETION_WINDOW,
                metadata=dict(metadata),
            ),
        )
        return BatchInfo.from_api(batch.model_dump())

    async def retrieve(self, batch_id: str) -> BatchInfo:
        """The batch's current state."""
        batch = await self._call("retrieve", lambda: self._sdk.batches.retrieve(batch_id))
        return BatchInfo.from_api(batch.model_dump())

    async def listing(self) -> AsyncIterator[BatchInfo]:
        """Every batch, newest first, page by page."""
        async for batch in self._pages("list", self._page):
            yield BatchInfo.from_api(batch.model_dump())

    async def _page(self, after: str | openai.Omit) -> Any:
        return await self._sdk.batches.list(limit=LIST_PAGE, after=after)

    async def file_listing(self) -> AsyncIterator[FileInfo]:
        """Every batch input file, newest first, page by page."""
        async for file in self._pages("list_files", self._file_page):
            yield FileInfo(file.id, file.filename, file.created_at)

    async def _file_page(self, after: str | openai.Omit) -> Any:
        return await self._sdk.files.list(
            purpose="batch", order="desc", limit=LIST_PAGE, after=after
        )

    async def _pages(
        self, method: str, fetch: Callable[[str | openai.Omit], Awaitable[Any]]
    ) -> AsyncIterator[Any]:
        """The items of a cursor-paged listing, each page fetched by ``fetch(after)``."""
        after: str | openai.Omit = openai.omit
        while True:
            page = await self._call(method, functools.partial(fetch, after))
            for item in page.data:
                yield item
            # A server that ignores `after` would send the same page forever.
            if not page.data or page.has_more is False or page.data[-1].id == after:
                return
            after = page.data[-1].id

    async def cancel(self, batch_id: str) -> BatchInfo:
        """Ask for the batch to be cancelled."""
        batch = await self._call("cancel", lambda: self._sdk.batches.cancel(batch_id))
        return BatchInfo.from_api(batch.model_dump())

    async def content(self, file_id: str) -> bytes:
        """A file's content."""
        got = await self._call(
            "content", lambda: self._sdk.files.content(file_id, timeout=FILE_TIMEOUT_S)
        )
        return got.content

    async def delete(self, file_id: str) -> None:
        """Delete a file (one already gone is no error)."""
        try:
            await self._call("delete", lambda: self._sdk.files.delete(file_id))
        except CallError as err:
            if err.status != 404:
                raise

    async def preflight(self, timeout: float = PREFLIGHT_S) -> None:
        """Raise UnreachableError when the endpoint cannot be reached (``reach.preflight``)."""
        await preflight([self._sdk], timeout)

    async def aclose(self) -> None:
        """Close the connections."""
        await self._sdk.close()


async def _paced(
    items: AsyncIterator[T], pace: Callable[[], Awaitable[None]] | None
) -> AsyncIterator[T]:
    """``items`` of a listing, ``pace`` awaited before each page's worth (LIST_PAGE)."""
    seen = 0
    async for item in items:
        if pace is not None and seen % LIST_PAGE == 0:
            await pace()
        seen += 1
        yield item


async def find_by_token(
    api: BatchAPI,
    tokens: set[str],
    since: float,
    pace: Callable[[], Awaitable[None]] | None = None,
    known: frozenset[str] = frozenset(),
) -> dict[str, BatchInfo]:
    """The batches whose metadata holds one of ``tokens``, by token.

    The listing goes newest first and stops at batches created before ``since`` (a Unix
    time, less the clock skew allowed), so an old account's history is not read to the
    end. ``pace`` is awaited before each page. Raises Undecided when a token is not found
    while an ``opaque`` batch created since (none of the ``known`` ids) might hold it.
    """
    wanted = set(tokens)
    found: dict[str, BatchInfo] = {}
    oldest = since - CLOCK_SKEW_S
    undecided: str | None = None
    async for info in _paced(api.listing(), pace):
        token = info.metadata.get(TOKEN_KEY)
        old = bool(info.created_at and info.created_at < oldest)
        if token in wanted:
            found[token] = info
            wanted.discard(token)
        elif info.opaque and not old and info.id not in known and undecided is None:
            undecided = info.id
        if not wanted or old:
            break
    if wanted and undecided is not None:
        raise Undecided(undecided)
    return found


@dataclass(frozen=True, slots=True)
class Side:
    """One side of the loop as the Batch API serves it: the model and its endpoint."""

    name: str  # "generator" or "critic": recorded in the ledger
    model: str
    api: BatchAPI


class Sides:
    """A run's Batch API endpoints by side: the generator's, and the critic's when the
    critic is another model."""

    __slots__ = ("critic", "generator")

    def __init__(self, generator: Side, critic: Side | None = None) -> None:
        self.generator = generator
        self.critic = critic

    @classmethod
    def over(cls, api: BatchAPI, generator: str, critic: str | None = None) -> Sides:
        """Both sides at one endpoint: ``api`` serving the models named."""
        return cls(
            Side("generator", generator, api),
            None if critic is None else Side("critic", critic, api),
        )

    def side(self, role: Role) -> Side:
        """The side that serves ``role``: the critic serves feedback when there is one."""
        if role == "feedback" and self.critic is not None:
            return self.critic
        return self.generator

    def named(self, name: str) -> Side:
        """The side a ledger entry names."""
        return self.critic if name == "critic" and self.critic is not None else self.generator

    def apis(self) -> list[BatchAPI]:
        """Each endpoint once."""
        apis = [self.generator.api]
        if self.critic is not None and self.critic.api is not self.generator.api:
            apis.append(self.critic.api)
        return apis

    async def aclose(self) -> None:
        """Close every endpoint's connections (once each)."""
        with anyio.CancelScope(shield=True):
            for api in self.apis():
                await api.aclose()


async def find_upload(
    api: BatchAPI,
    name: str,
    since: float,
    pace: Callable[[], Awaitable[None]] | None = None,
) -> list[str]:
    """The ids of the batch input files named ``name`` uploaded since ``since`` (Unix time).

    A run killed between uploading a file and journaling its id, or whose upload's answer
    was lost, finds the file this way. The listing goes newest first and stops at files
    older than ``since``, less the clock skew allowed.
    """
    oldest = since - CLOCK_SKEW_S
    found: list[str] = []
    async for info in _paced(api.file_listing(), pace):
        if info.created_at and info.created_at < oldest:
            break
        if info.filename == name:
            found.append(info.id)
    return found
