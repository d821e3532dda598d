"""The Batch API driver: Self-Refine's rounds through ``/v1/files`` and ``/v1/batches``.

The driver holds a window of records (their steps in memory: the memory bound is
``BatchConfig.window`` records) and, every ``--poll`` seconds:

1. reads records into the window;
2. looks at each batch in flight; an ended batch's lines are matched to their calls by
   custom_id and checkpointed exactly like real-time calls (a line is applied only when
   its record's journal holds exactly the steps before it, so no line is applied twice),
   failed lines follow the real-time retry policy, lines never run go out again, and the
   batch's files are deleted;
3. sends the next call of every record waiting for one: lines grouped by model, split
   within the file limits, each batch's intent journaled in the ledger before anything
   is sent and its id right after it is created.

With ``--detach`` it does this once and exits 75 while batches are in flight; the same
command continues. A kill at any moment repeats no call: an intent without a batch id is
looked for by its token (the batch's metadata) before anything is sent again.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import orjson
from aiolimiter import AsyncLimiter
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from ..budget import Reservation
from ..core.loop import Call, Stop, call_failed, finish, make_step, next_call
from ..core.records import Record
from ..core.steps import Completion, Step, Try
from ..errors import (
    BatchFailed,
    BudgetReached,
    CallError,
    ConfigError,
    FatalCallError,
    RefineError,
    StoreError,
    UnavailableError,
)
from ..formats import FormatLadder
from ..limits import estimate_tokens
from ..retry import OutageState, decide, retryable
from ..runner import Models, Session, StopReason, stop_reason_of
from .api import (
    TOKEN_KEY,
    BatchClients,
    BatchInfo,
    Side,
    find_by_token,
    find_upload,
    input_file_name,
)
from .ledger import Entry, Ledger
from .lines import LINE_OVERHEAD, Answer, custom_id, input_line, read_output, read_result, split

if TYPE_CHECKING:
    from ..core.steps import Outcome

__all__ = ["run_batches"]

log = logging.getLogger("refine")

# Lines checkpointed at once when a batch ends (the journal groups their writes).
APPLY_AT_ONCE = 256


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


async def run_batches(session: Session, models: Models) -> None:
    """The Batch API driver (``--batch``): every call of the run through batches."""
    if models.batch is None:
        raise ConfigError("--batch needs the Batch API clients of the run")
    driver = _Driver(session, models.batch)
    try:
        await driver.run()
    finally:
        driver.ledger.close()


class _Driver:
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

    # -- the rounds ------------------------------------------------------------------------

    async def run(self) -> None:
        """Run rounds until every record is done, the run stops, or it detaches."""
        send, receive = anyio.create_memory_object_stream[Record](0)
        async with receive, anyio.create_task_group() as tg:
            tg.start_soon(self._produce, send)
            try:
                await self._rounds(receive)
            except (FatalCallError, StoreError, BatchFailed, BudgetReached) as err:
                self.session.stop.set(stop_reason_of(err), err)
            finally:
                tg.cancel_scope.cancel()

    async def _produce(self, send: ObjectSendStream[Record]) -> None:
        async with send:
            await self.session.records(send.send)

    async def _rounds(self, receive: ObjectReceiveStream[Record]) -> None:
        stop = self.session.stop
        self.ledger.compact(self._pending)
        await self._reconcile()
        live = self.ledger.state.live_calls().items()
        # Calls applied before a stop (their batch not yet marked collected) are not awaited.
        self.live = {rid: call for rid, call in live if self._pending(rid, call[1])}
        while not stop.stopping:
            await self._fill(receive)
            await self._poll()
            if self.auth is not None:
                raise self.auth
            await self._submit()
            self._publish()
            if self._done():
                return
            if self.settings.detach:
                stop.set(StopReason.DETACHED, RefineError(self._detach_message()))
                return
            await self.clients.sleep(self.settings.poll)

    def _done(self) -> bool:
        return self.exhausted and not self.held and not self.ledger.state.entries

    def _detach_message(self) -> str:
        entries = self.ledger.state.entries.values()
        waiting = sum(1 for h in self.held.values() if h.token is not None)
        return (
            f"{sum(1 for e in entries if e.batch_id is not None)} batch(es) in flight for "
            f"{waiting} record(s); run the same command again to collect them and go on"
        )

    def _pending(self, record_id: str, index: int) -> bool:
        """Whether the call at ``index`` of a record is still to be made (ledger compaction)."""
        if record_id in self.session.outputs.finished:
            return False
        return len(self.session.prior.get(record_id, ())) == index

    # -- the window --------------------------------------------------------------------------

    async def _fill(self, receive: ObjectReceiveStream[Record]) -> None:
        """Read records while the window has room, and past it for records of live batches."""
        while not self.exhausted and (len(self.held) < self.config.window or self.live):
            try:
                record = await receive.receive()
            except anyio.EndOfStream:
                self.exhausted = True
                if self.live:
                    log.warning(
                        "%d record(s) of batches in flight are not in the input any more; "
                        "their lines are ignored",
                        len(self.live),
                    )
                    self.live.clear()
                return
            self._take(record)

    def _take(self, record: Record) -> None:
        steps = self.session.take_prior(record.id)
        held = _Held(record, steps)
        self.held[record.id] = held
        live = self.live.pop(record.id, None)
        statuses = self.ledger.state.failures.get((record.id, len(steps)), ())
        held.tries = [Try(s, 0.0) for s in statuses]
        self._advance(held)
        if held.call is not None and live is not None and live[1] == len(steps):
            held.token = live[0]
            side = self.clients.side(held.call.role)
            sent, _ = self.formats.request(held.call.messages, held.call.schema, 0)
            # Already paid for: held even when the budget has no room left.
            amount = self.session.budget.worst_case(
                side.model, estimate_tokens(sent), held.call.max_tokens, batch=True
            )
            if amount is not None:
                held.reservation = self.session.budget.try_reserve(side.model, amount, batch=True)

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

    async def _reconcile(self) -> None:
        """Adopt the batches of intents whose id was never recorded; forget the rest."""
        unsure = [e for e in self.ledger.state.entries.values() if e.batch_id is None]
        if not unsure:
            return
        try:
            found = await self._find(unsure)
        except CallError as err:
            if isinstance(err, FatalCallError):
                raise
            raise UnavailableError(
                "unavailable", f"cannot list batches to find those of an earlier run: {err}"
            ) from err
        for e in unsure:
            info = found.get(e.token)
            if info is not None:
                log.warning("batch %s adopted: created before a stop, found by its token", info.id)
                self.ledger.created(e.token, info.id)
            else:
                await self._forget(e, "never created")

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

    # -- polling and collecting ------------------------------------------------------------------

    async def _poll(self) -> None:
        """Look at every open batch; collect those that ended; finish deleting files."""
        for entry in list(self.ledger.state.entries.values()):
            if entry.collected:
                await self._delete_files(entry, "collected")
                continue
            if entry.batch_id is None:
                continue
            api = self.clients.named(entry.side).api
            try:
                async with self.polls:
                    info = await api.retrieve(entry.batch_id)
            except CallError as err:
                if err.status == 404:
                    log.warning("batch %s is gone (404); its calls go out again", entry.batch_id)
                    await self._forget(entry, "gone")
                    continue
                self._failed(err, f"retrieving batch {entry.batch_id}")
                continue
            self._ok()
            self.status[entry.token] = info.status
            if info.terminal:
                await self._collect(entry, info)

    async def _collect(self, entry: Entry, info: BatchInfo) -> None:
        """Checkpoint an ended batch's answered lines; its other calls go out again."""
        if info.status == "failed":
            await self._refused(entry, info)
            return
        api = self.clients.named(entry.side).api
        results: dict[int, Mapping[str, Any]] = {}
        files = [f for f in (info.output_file_id, info.error_file_id) if f]
        for file_id in files:
            try:
                async with self.polls:
                    data = await api.content(file_id)
            except CallError as err:
                if err.status == 404:  # gone (files expire): its lines count as never answered
                    log.warning(
                        "file %s of batch %s is gone; its lines go out again", file_id, info.id
                    )
                    continue
                self._failed(err, f"downloading file {file_id} of batch {info.id}")
                return  # collected at a later poll
            for index, line in read_output(data, entry.token):
                results.setdefault(index, line)  # a line the provider sent twice counts once
        ended = info.ended_at or int(time.time())
        latency = float(max(0, ended - info.created_at)) if info.created_at else 0.0
        failed: list[tuple[str, int, int | str]] = []
        limiter = anyio.Semaphore(APPLY_AT_ONCE)

        async def apply(held: _Held, level: int, line: Mapping[str, Any] | None) -> None:
            async with limiter:
                await self._apply(held, entry, info, level, line, latency, failed)

        try:
            async with anyio.create_task_group() as tg:
                for index, (rid, n, level) in enumerate(entry.calls):
                    held = self.held.get(rid)
                    if held is None or held.token != entry.token or len(held.steps) != n:
                        continue  # applied before a stop, or its record is done
                    tg.start_soon(apply, held, level, results.get(index))
        except* StoreError as group:
            raise group.exceptions[0] from group
        answered = sum(1 for line in results.values() if isinstance(line.get("response"), dict))
        log.info(
            "batch %s %s: %d of %d line(s) answered",
            info.id,
            info.status,
            answered,
            len(entry.calls),
        )
        self._crash("before_collected")
        self.ledger.collected(entry.token, info.status, failed, files)
        self.blocked.discard(entry.side)
        await self._delete_files(entry, "collected")

    async def _apply(
        self,
        held: _Held,
        entry: Entry,
        info: BatchInfo,
        level: int,
        line: Mapping[str, Any] | None,
        latency: float,
        failed: list[tuple[str, int, int | str]],
    ) -> None:
        """Apply one line of an ended batch to its record."""
        held.token = None
        call = held.call
        assert call is not None
        result = None if line is None else read_result(line)
        if result is None and info.status == "completed":
            # A batch that says it ran every line but holds no answer for this one: counted
            # as a failed attempt, so a provider that keeps doing it cannot loop us forever.
            result = CallError("bad_response", "the completed batch holds no line for this call")
        if result is None:  # never run (expired or cancelled first): out again, no retry used
            self._release(held)
            return
        side = self.clients.named(entry.side)
        sent, _ = self.formats.request(call.messages, call.schema, level)
        if isinstance(result, Answer):
            await self._answered(held, side, info, sent, result, latency)
            return
        self._release(held)
        err = result
        if call.schema is not None and err.status is not None:
            lower = self.formats.refused(err.status, str(err), level)
            if lower is not None:  # asked the format the endpoint refuses: not a failed attempt
                held.level = lower
                return
        decision = decide(
            err,
            attempt=len(held.tries) + 1,
            max_retries=self.settings.max_retries,
            outage=OutageState(),
            rand=0.0,
        )
        if decision.action == "stop":
            self.auth = err  # stops the run once the batch's other lines are saved
            return
        held.tries.append(Try(err.status or err.kind, latency))
        if decision.action == "retry":
            failed.append((held.record.id, len(held.steps), err.status or err.kind))
            self.clients.retries += 1
            return
        err.attempts, err.tries = len(held.tries), tuple(held.tries)
        err.messages, err.model = sent, side.model
        self._finish(held, call_failed(self.session.job, held.record, held.steps, call, err))

    async def _answered(
        self,
        held: _Held,
        side: Side,
        info: BatchInfo,
        sent: list[dict[str, str]],
        answer: Answer,
        latency: float,
    ) -> None:
        call = held.call
        assert call is not None
        usage = answer.usage
        tries = (*held.tries, Try(200, latency)) if held.tries else ()
        comp = Completion(
            text=answer.text,
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            cached_tokens=usage["cached_tokens"],
            latency_s=latency,
            attempts=len(held.tries) + 1,
            finish_reason=answer.finish_reason,
            messages=sent,
            model=side.model,
            tries=tries,
            batch_id=info.id,
        )
        job = self.session.job
        step = await make_step(job, held.record, call, comp, held.steps, self.session.policy.checks)
        await self.sink.save(held.record.id, len(held.steps), step)
        held.steps.append(step)
        budget = self.session.budget
        if held.reservation is not None:
            budget.settle(held.reservation, step.usage)
            held.reservation = None
        else:
            budget.charge(side.model, step.usage, batch=True)
        held.tries, held.level, held.call = [], 0, None
        self.clients.calls += 1
        self._advance(held)

    async def _refused(self, entry: Entry, info: BatchInfo) -> None:
        """A batch failed at validation: a token limit waits; anything else stops the run."""
        for held in self._carried(entry):
            held.token = None
            self._release(held)
        self.ledger.collected(entry.token, info.status, [], [])
        await self._delete_files(entry, "failed")
        if any(issue.code == "token_limit_exceeded" for issue in info.errors):
            self.clients.rate_limited += 1
            others = any(
                e.live and e.side == entry.side for e in self.ledger.state.entries.values()
            )
            if others:
                self.blocked.add(entry.side)  # until one of the batches in flight ends
            else:
                self.cap[entry.side] = max(1, len(entry.calls) // 2)
            log.info(
                "batch %s refused for the enqueued token limit; its lines go out again %s",
                info.id,
                "once a batch in flight ends" if others else "in smaller batches",
            )
            return
        raise BatchFailed(f"batch {info.id} failed validation", info.errors)

    # -- sending -------------------------------------------------------------------------------

    async def _submit(self) -> None:
        """Send the next call of every record waiting for one, within the budget and limits."""
        await self._retry_creates()
        ready = [h for h in self.held.values() if h.call is not None and h.token is None]
        by_side: dict[str, list[tuple[_Held, bytes, int]]] = {}
        blocked = 0
        for held in ready:
            call = held.call
            assert call is not None
            side = self.clients.side(call.role)
            if side.name in self.blocked:
                continue
            level = max(self.formats.level, held.level)
            sent, extra = self.formats.request(call.messages, call.schema, level)
            if held.reservation is None and not self._reserve(held, side, sent, call):
                blocked += 1
                continue
            body = orjson.dumps(
                {
                    "model": side.model,
                    "messages": sent,
                    "temperature": call.temperature,
                    "max_tokens": call.max_tokens,
                    **call.sampling(),
                    **extra,
                }
            )
            if len(body) + LINE_OVERHEAD > self.config.max_bytes:
                self._too_large(held, call, sent, side, len(body))
                continue
            by_side.setdefault(side.name, []).append((held, body, level))
        round_ = self.ledger.state.rounds + 1
        for name, members in by_side.items():
            side = self.clients.named(name)
            max_lines = min(self.config.max_lines, self.cap.get(name, self.config.max_lines))
            sizes = [len(body) + LINE_OVERHEAD for _, body, _ in members]
            for start, end in split(sizes, max_lines, self.config.max_bytes):
                await self._send(side, round_, members[start:end])
        outstanding = self.ledger.state.entries or any(h.token for h in self.held.values())
        if blocked and not by_side and not outstanding:
            raise BudgetReached(
                f"budget reached: ${self.session.budget.spent:.4f} of --budget "
                f"${self.settings.budget:g} spent; {blocked} call(s) cannot be paid for even "
                "at Batch API prices. Re-run with a larger --budget to continue"
            )

    def _reserve(self, held: _Held, side: Side, sent: list[dict[str, str]], call: Call) -> bool:
        """Hold the call's worst case at Batch API prices; False when it does not fit."""
        budget = self.session.budget
        amount = budget.worst_case(side.model, estimate_tokens(sent), call.max_tokens, batch=True)
        if amount is None:
            budget.unknown = True
            return True
        held.reservation = budget.try_reserve(side.model, amount, batch=True)
        return held.reservation is not None

    def _too_large(
        self, held: _Held, call: Call, sent: list[dict[str, str]], side: Side, size: int
    ) -> None:
        err = CallError(
            "too_large",
            f"the request is {size} bytes, more than a batch file may hold "
            f"({self.config.max_bytes})",
            attempts=0,
            messages=sent,
            model=side.model,
        )
        self._finish(held, call_failed(self.session.job, held.record, held.steps, call, err))

    async def _send(
        self, side: Side, round_: int, members: Sequence[tuple[_Held, bytes, int]]
    ) -> None:
        """Journal one batch's intent, upload its file, create it."""
        token = secrets.token_hex(8)
        calls = [[h.record.id, len(h.steps), level] for h, _, level in members]
        entry = self.ledger.intent(token, round_, side.name, side.model, calls)
        for held, _, _ in members:
            held.token = token
        data = b"".join(
            input_line(custom_id(token, i), body) for i, (_, body, _) in enumerate(members)
        )
        try:
            async with self.creates:
                file_id = await side.api.upload(input_file_name(token), data)
        except CallError as err:
            await self._forget(entry, "upload failed")
            self._failed(err, "uploading a batch input file")
            return
        self._ok()
        self._crash("after_upload")
        self.ledger.uploaded(token, file_id)
        self.status[token] = "creating"
        await self._create(entry)

    async def _create(self, entry: Entry) -> None:
        side = self.clients.named(entry.side)
        assert entry.file_id is not None
        metadata = {
            TOKEN_KEY: entry.token,
            "refine_round": str(entry.round),
            "refine_run": self.session.rd.path.name[:500],
        }
        try:
            async with self.creates:
                info = await side.api.create(entry.file_id, metadata)
        except CallError as err:
            if isinstance(err, FatalCallError):
                raise
            if err.status == 429:  # a queue or rate limit: the same batch is asked for later
                self.clients.rate_limited += 1
                self.retry_create[entry.token] = self.clients.clock() + self.settings.poll
                log.info("batch creation refused (%s); asking again at the next poll", err)
                return
            if err.status is not None and err.status < 500:
                await self._forget(entry, "refused")
                raise BatchFailed(f"creating a batch: the Batch API refused it ({err})") from err
            # Sent, but the answer was lost: the batch may exist. Looked for before asking again.
            self.unsure.add(entry.token)
            self._failed(err, "creating a batch")
            return
        self._crash("after_create")
        self.ledger.created(entry.token, info.id)
        self.status[entry.token] = info.status
        self._ok()

    async def _retry_creates(self) -> None:
        """Ask again for batches whose creation was refused, or whose outcome was lost."""
        entries = self.ledger.state.entries
        if self.unsure:
            unsure = [entries[t] for t in self.unsure if t in entries]
            self.unsure.clear()
            try:
                found = await self._find(unsure)
            except CallError as err:
                self.unsure.update(e.token for e in unsure)
                self._failed(err, "listing batches")
                return
            for e in unsure:
                info = found.get(e.token)
                if info is not None:
                    self.ledger.created(e.token, info.id)
                else:
                    await self._create(e)
        now = self.clients.clock()
        for token, at in list(self.retry_create.items()):
            if at <= now and token in entries:
                del self.retry_create[token]
                await self._create(entries[token])

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
