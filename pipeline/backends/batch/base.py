"""The Batch API driver's state: the records in its window, its batches, its bookkeeping."""

from __future__ import annotations

import logging
import os
import signal
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiolimiter import AsyncLimiter

from ...client.budget import Reservation
from ...client.formats import FormatLadder
from ...client.retry import retryable
from ...core.loop import Call, Stop, finish, next_call
from ...core.records import Record
from ...core.steps import Outcome, Step, Try
from ...errors import BatchFailed, CallError, FatalCallError, UnavailableError
from ...runs.session import Session
from .api import BatchClients, BatchInfo, find_by_token, find_upload, input_file_name
from .ledger import Entry, Ledger

log = logging.getLogger("refine")


@dataclass(slots=True)
class _Held:
    """A record in the window: its steps, its next call and the batch carrying that call."""

    record: Record
    steps: list[Step]
    call: Call | None = None
    level: int = 0  # this call's structured-output floor, after a 400 hinting at the format
    token: str | None = None  # the open batch that carries the call
    tries: list[Try] = field(default_factory=list)  # failed attempts that used up a retry
    reservation: Reservation | None = None


class _Base:
    """The state every part of the driver shares, and the small steps they all take."""

    def __init__(self, session: Session, clients: BatchClients) -> None:
        self.session = session
        self.clients = clients
        self.config = clients.config
        self.settings = session.settings
        self.ledger = Ledger(session.rd.batches_path, fsync=self.settings.fsync, warn=log.warning)
        self.formats = FormatLadder(self.settings.structured)
        self.sink = session.sink()
        self.held: dict[str, _Held] = {}
        self.exhausted = False  # the record stream has ended
        self.live: dict[str, tuple[str, int]] = {}  # record -> (token, step) of live calls unread
        self.status: dict[str, str] = {}  # token -> the batch's last known status
        self.retry_create: dict[str, float] = {}  # token -> when to ask again (refused)
        self.unsure: set[str] = set()  # tokens whose creation may have happened
        self.blocked: set[str] = set()  # sides waiting for a batch to end (token limit)
        self.cap: dict[str, int] = {}  # lines a file by side, halved after a token limit
        self.failing_since: float | None = None
        self.auth: CallError | None = None
        # Fixed-rate pacing of the control requests: no burst, strictly 1/rate apart.
        self.creates = AsyncLimiter(1, 1 / self.config.creates_per_s)
        self.polls = AsyncLimiter(1, 1 / self.config.polls_per_s)

    def _advance(self, held: _Held) -> None:
        """Plan the record's next call, or finish it."""
        nxt = next_call(self.session.job, held.record, held.steps, self.session.policy)
        if isinstance(nxt, Stop):
            self._finish(held, finish(self.session.job, held.record, held.steps, nxt.reason))
        else:
            held.call = nxt

    def _finish(self, held: _Held, outcome: Outcome) -> None:
        self._release(held)
        held.call = None
        self.held.pop(held.record.id, None)
        self.session.finish(outcome)

    def _release(self, held: _Held) -> None:
        """Free the money held for a call that was not answered."""
        self.session.budget.settle(held.reservation, None)
        held.reservation = None

    # -- control requests --------------------------------------------------------------------

    def _ok(self) -> None:
        self.failing_since = None

    def _failed(self, err: CallError, what: str) -> None:
        """A control request failed: tried again at the next poll, until --max-outage."""
        if isinstance(err, FatalCallError):
            raise err
        if not retryable(err):
            raise BatchFailed(f"{what}: the Batch API refused it ({err})") from err
        now = self.clients.clock()
        if self.failing_since is None:
            self.failing_since = now
        log.warning("%s failed (%s); trying again at the next poll", what, err)
        if now - self.failing_since > self.settings.max_outage:
            raise UnavailableError(
                "unavailable",
                f"the Batch API has been failing for {now - self.failing_since:.0f} s "
                f"(last: {err}); stopped, resumable",
                status=err.status,
            ) from err

    # -- finding batches by their token -------------------------------------------------------

    async def _find(self, entries: Sequence[Entry]) -> dict[str, BatchInfo]:
        """The batches of these intents that exist, found by their tokens."""
        found: dict[str, BatchInfo] = {}
        by_side: dict[str, list[Entry]] = {}
        for e in entries:
            by_side.setdefault(e.side, []).append(e)
        for name, group in by_side.items():
            api = self.clients.named(name).api
            since = min(e.at for e in group)
            found |= await find_by_token(api, {e.token for e in group}, since, self.polls.acquire)
        return found

    async def _forget(self, entry: Entry, why: str) -> None:
        """Close a batch that does not exist: delete its input file, give its calls back."""
        for held in self._carried(entry):
            held.token = None
        if entry.file_id is None:
            await self._find_upload(entry)
        await self._delete_files(entry, why)

    async def _find_upload(self, entry: Entry) -> None:
        """Journal the input file of an intent whose upload was never journaled (the run
        stopped, or the upload's answer was lost, after the file arrived), so it is deleted
        with the intent's other files rather than left on the provider."""
        api = self.clients.named(entry.side).api
        name = input_file_name(entry.token)
        try:
            found = await find_upload(api, name, entry.at, self.polls.acquire)
        except CallError as err:
            if isinstance(err, FatalCallError):
                raise
            log.warning("cannot list files to find %s (%s); if uploaded, it is left", name, err)
            return
        for file_id in found:
            log.warning("file %s (%s) was uploaded but never used; it is deleted", file_id, name)
            self.ledger.uploaded(entry.token, file_id)

    def _carried(self, entry: Entry) -> list[_Held]:
        """The held records whose call this batch carries."""
        out = []
        for rid, n, _ in entry.calls:
            held = self.held.get(rid)
            if held is not None and held.token == entry.token and len(held.steps) == n:
                out.append(held)
        return out

    async def _delete_files(self, entry: Entry, why: str) -> None:
        api = self.clients.named(entry.side).api
        for file_id in entry.files:
            try:
                async with self.polls:
                    await api.delete(file_id)
            except CallError as err:
                if retryable(err) or isinstance(err, FatalCallError):
                    self._failed(err, f"deleting file {file_id}")
                    return  # the entry stays open: deleted at a later poll
                # A server that cannot delete files must not stop the run over it.
                log.warning("file %s could not be deleted (%s); it is left in place", file_id, err)
        self.ledger.closed(entry.token, why)
        self.status.pop(entry.token, None)

    def _crash(self, point: str) -> None:
        """Crash tests: die here, as a SIGKILL would kill the process, when asked to."""
        if self.config.crash == point:
            os.kill(os.getpid(), signal.SIGKILL)

    # -- progress ------------------------------------------------------------------------------

    def _publish(self) -> None:
        c = self.session.counters
        c.batches = dict(Counter(self.status.values()))
        c.waiting = dict(Counter(h.call.role for h in self.held.values() if h.call is not None))
        c.in_flight = sum(1 for h in self.held.values() if h.token is not None)
