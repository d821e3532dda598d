"""The Batch API driver: Self-Refine's rounds through ``/v1/files`` and ``/v1/batches``.

The driver holds a window of records (their steps in memory: the memory bound is
``BatchConfig.window`` records) and, every ``--poll`` seconds:

1. reads records into the window;
2. looks at each batch in flight; an ended batch's lines are matched to their calls by
   custom_id and checkpointed exactly like real-time calls (a line is applied only when
   its record's journal holds exactly the steps before it, so no line is applied twice),
   failed lines follow the one retry sequence real-time calls follow (each call's
   ``Attempts``, kept across the batches that carry it), lines never run go out again,
   and the batch's files are deleted;
3. sends the next call of every record waiting for one: lines grouped by model, split
   within the file limits, each batch's intent journaled in the ledger before anything
   is sent and its id right after it is created.

With ``--detach`` it does this once and exits 75 while batches are in flight; the same
command continues. A kill at any moment repeats no call: an intent without a batch id is
looked for by its token (the batch's metadata) before anything is sent again.

One class over its parts: the records it holds (``window``), the lines (``lines``, pure),
and the run's batches, kept in step with the ledger (``batches``, over the paced control
requests of ``control``). The driver owns the records: their steps, budget and journal.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from ...client.attempts import Attempts, FailRecord, HaltRun, Retry
from ...client.context import context_window, overflow
from ...client.formats import FormatLadder
from ...client.limits import estimate_tokens
from ...core.loop import Call, Stop, call_failed, finish, make_step, next_call
from ...core.records import Record
from ...core.steps import Completion, Outcome, Try
from ...errors import (
    BatchFailed,
    BudgetReached,
    CallError,
    FatalCallError,
    RefineError,
    StoreError,
)
from ...runs.session import CallCounts, Halt, Session, halt_of
from .api import BatchInfo, Side, Sides
from .batches import Batches
from .config import BatchConfig
from .control import Control
from .ledger import Entry, Ledger
from .lines import LINE_OVERHEAD, LineReply, read_result, request_body, split
from .opening import OpenedAPI
from .window import Held, Window

__all__ = ["BatchDriver"]

log = logging.getLogger("refine")

# Lines checkpointed at once when a batch ends (the journal groups their writes).
APPLY_AT_ONCE = 256


class BatchDriver:
    """The rounds: fill the window, look at the batches in flight, send the next calls."""

    def __init__(
        self,
        session: Session,
        sides: Sides,
        config: BatchConfig,
        *,
        opened: Sequence[OpenedAPI] = (),
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.settings = session.settings
        self.sides = sides
        self.config = config
        self.opened = opened  # the endpoints its backend opened: reached before the rounds
        # The waits between polls and the clock that times refusals and outages (tests
        # pass a fake clock's, so no test sleeps for real).
        self.sleep = sleep
        self.ledger = Ledger(session.rd.batches_path, fsync=self.settings.fsync, warn=log.warning)
        self.formats = FormatLadder(self.settings.structured)
        self.sink = session.sink()
        self.window = Window()
        self.batches = Batches(
            self.ledger,
            Control(sides, config, clock, self.settings.max_outage),
            self.window,
            run_name=session.rd.path.name,
            poll=self.settings.poll,
            clock=clock,
        )
        self.halted: HaltRun | None = None  # a line halts the run (the key refused): after
        # the batch's other lines are saved
        self.calls = 0  # batch lines answered and checkpointed
        self.retries = 0  # failed lines sent again in a later batch

    async def preflight(self) -> None:
        """Raise UnreachableError when an endpoint its backend opened cannot be reached."""
        for api in self.opened:
            await api.preflight()

    def counts(self) -> CallCounts:
        """Lines answered, lines retried and refused creations."""
        return CallCounts(self.calls, self.retries, self.batches.rate_limited)

    # -- the rounds ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run rounds until every record is done, the run halts, or it detaches."""
        send, receive = anyio.create_memory_object_stream[Record](0)
        async with receive, anyio.create_task_group() as tg:
            tg.start_soon(self._produce, send)
            try:
                await self._rounds(receive)
            except (FatalCallError, StoreError, BatchFailed, BudgetReached) as err:
                self.session.halting.set(halt_of(err), err)
            finally:
                tg.cancel_scope.cancel()

    async def _produce(self, send: ObjectSendStream[Record]) -> None:
        async with send:
            await self.session.records(send.send)

    async def _rounds(self, receive: ObjectReceiveStream[Record]) -> None:
        halting = self.session.halting
        self.ledger.compact(self._pending)
        await self.batches.reconcile()
        live = self.ledger.state.live_calls().items()
        # Calls applied before a halt (their batch not yet marked collected) are not awaited.
        self.window.live = {rid: call for rid, call in live if self._pending(rid, call[1])}
        while not halting.requested:
            await self._fill(receive)
            await self._poll()
            if self.halted is not None:
                raise self.halted.error from self.halted.cause
            await self._submit()
            self._publish()
            if self._done():
                return
            if self.settings.detach:
                halting.set(Halt.DETACHED, RefineError(self._detach_message()))
                return
            await self.sleep(self.settings.poll)

    def _done(self) -> bool:
        return self.window.exhausted and not self.window.held and not self.ledger.state.entries

    def _detach_message(self) -> str:
        entries = self.ledger.state.entries.values()
        return (
            f"{sum(1 for e in entries if e.batch_id is not None)} batch(es) in flight for "
            f"{self.window.in_batches()} record(s); run the same command again to collect "
            "them and go on"
        )

    def _pending(self, record_id: str, index: int) -> bool:
        """Whether the call at ``index`` of a record is still to be made (ledger compaction)."""
        if record_id in self.session.outputs.finished:
            return False
        return len(self.session.prior.get(record_id, ())) == index

    def _publish(self) -> None:
        c = self.session.counters
        c.batches = dict(Counter(self.batches.status.values()))
        c.waiting = self.window.waiting()
        c.in_flight = self.window.in_batches()

    # -- the window ----------------------------------------------------------------------------

    async def _fill(self, receive: ObjectReceiveStream[Record]) -> None:
        """Read records while the window has room, and past it for records of live batches."""
        window = self.window
        while not window.exhausted and (len(window) < self.config.window or window.live):
            try:
                record = await receive.receive()
            except anyio.EndOfStream:
                window.exhausted = True
                if window.live:
                    log.warning(
                        "%d record(s) of batches in flight are not in the input any more; "
                        "their lines are ignored",
                        len(window.live),
                    )
                    window.live.clear()
                return
            self._take(record)

    def _take(self, record: Record) -> None:
        steps = self.session.take_prior(record.id)
        held = Held(record, steps)
        self.window.held[record.id] = held
        live = self.window.live.pop(record.id, None)
        self._advance(held, self.ledger.state.failures.get((record.id, len(steps)), ()))
        if held.call is not None and live is not None and live[1] == len(steps):
            held.token = live[0]
            side = self.sides.side(held.call.role)
            request = held.call.request
            sent, _ = self.formats.request(request.messages, request.schema, 0)
            # Already paid for: held even when the budget has no room left.
            amount = self.session.budget.worst_case(
                side.model, estimate_tokens(sent), request.max_tokens, batch=True
            )
            if amount is not None:
                held.reservation = self.session.budget.try_reserve(side.model, amount, batch=True)

    def _advance(self, held: Held, failures: Sequence[int | str] = ()) -> None:
        """Plan the record's next call, or finish it. ``failures``: the statuses of the
        call's failed attempts that used up a retry, as the ledger counted them (a resume)."""
        nxt = next_call(self.session.job, held.record, held.steps, self.session.policy)
        if isinstance(nxt, Stop):
            self._finish(held, finish(self.session.job, held.record, held.steps, nxt.reason))
            return
        held.call = nxt
        held.attempts = Attempts(
            self.sides.side(nxt.role).model,
            self.settings.max_retries,
            tries=(Try(s, 0.0) for s in failures),
            counted=len(failures),
        )

    def _finish(self, held: Held, outcome: Outcome) -> None:
        self._release(held)
        held.call, held.attempts = None, None
        self.window.held.pop(held.record.id, None)
        self.session.finish(outcome)

    def _release(self, held: Held) -> None:
        """Free the money held for a call that was not answered."""
        self.session.budget.settle(held.reservation, None)
        held.reservation = None

    # -- polling and collecting ----------------------------------------------------------------

    async def _poll(self) -> None:
        """Look at every open batch; collect those that ended; finish deleting files."""
        for entry in self.batches.open_entries():
            info = await self.batches.look(entry)
            if info is None:
                continue
            if info.status == "failed":
                await self._refused(entry, info)
            else:
                await self._collect(entry, info)

    async def _collect(self, entry: Entry, info: BatchInfo) -> None:
        """Checkpoint an ended batch's answered lines; its other calls go out again."""
        results = await self.batches.results(entry, info)
        if results is None:
            return  # collected at a later poll
        ended = info.ended_at or int(time.time())
        latency = float(max(0, ended - info.created_at)) if info.created_at else 0.0
        failed: list[tuple[str, int, int | str]] = []
        limiter = anyio.Semaphore(APPLY_AT_ONCE)

        async def apply(held: Held, level: int, line: Mapping[str, Any] | None) -> None:
            async with limiter:
                await self._apply(held, entry, info, level, line, latency, failed)

        try:
            async with anyio.create_task_group() as tg:
                for index, (rid, n, level) in enumerate(entry.calls):
                    held = self.window.held.get(rid)
                    if held is None or held.token != entry.token or len(held.steps) != n:
                        continue  # applied before a halt, or its record is done
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
        await self.batches.collected(entry, info, failed)

    async def _apply(
        self,
        held: Held,
        entry: Entry,
        info: BatchInfo,
        level: int,
        line: Mapping[str, Any] | None,
        latency: float,
        failed: list[tuple[str, int, int | str]],
    ) -> None:
        """Apply one line of an ended batch to its record."""
        held.token = None
        call, attempts = held.call, held.attempts
        assert call is not None and attempts is not None
        result = None if line is None else read_result(line)
        if result is None and info.status == "completed":
            # A batch that says it ran every line but holds no answer for this one: counted
            # as a failed attempt, so a provider that keeps doing it cannot loop us forever.
            result = CallError("bad_response", "the completed batch holds no line for this call")
        if result is None:  # never run (expired or cancelled first): out again, no retry used
            self._release(held)
            return
        request = call.request
        sent, _ = self.formats.request(request.messages, request.schema, level)
        if isinstance(result, LineReply):
            await self._replied(held, self.sides.named(entry.side), info, sent, result, latency)
            return
        self._release(held)
        attempts.failed(result, latency)
        ladder = self.formats if request.schema is not None else None
        # No outage breaker and no waits here: a retried line goes out in the next batch,
        # whatever the verdict's delay.
        verdict = attempts.after(result, sent, level, ladder=ladder)
        if isinstance(verdict, HaltRun):
            self.halted = verdict  # once the batch's other lines are saved
        elif isinstance(verdict, FailRecord):
            failure = call_failed(self.session.job, held.record, held.steps, call, verdict.error)
            self._finish(held, failure)
        elif isinstance(verdict, Retry):
            if verdict.counted:  # the ledger keeps it: a resumed call has used it up
                failed.append((held.record.id, len(held.steps), result.status or result.category))
            self.retries += 1
        # A StepDown goes out in the next batch, at its lower level.

    async def _replied(
        self,
        held: Held,
        side: Side,
        info: BatchInfo,
        sent: list[dict[str, str]],
        reply: LineReply,
        latency: float,
    ) -> None:
        call, attempts = held.call, held.attempts
        assert call is not None and attempts is not None
        usage = reply.usage
        tries = attempts.succeeded(latency)
        comp = Completion(
            text=reply.text,
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            cached_tokens=usage["cached_tokens"],
            cache_write_tokens=usage.get("cache_write_tokens", 0),
            cache_write_1h_tokens=usage.get("cache_write_1h_tokens", 0),
            latency_s=latency,
            attempts=len(attempts.tries),
            finish_reason=reply.finish_reason,
            messages=sent,
            model=side.model,
            tries=tries,
            batch_id=info.id,
        )
        job = self.session.job
        step = await make_step(job, held.record, call, comp, held.steps, self.session.policy.checks)
        await self.sink.save(held.record.id, held.steps, step)
        held.steps.append(step)
        budget = self.session.budget
        if held.reservation is not None:
            budget.settle(held.reservation, step.usage)
            held.reservation = None
        else:
            budget.charge(side.model, step.usage, batch=True)
        held.call, held.attempts = None, None
        self.calls += 1
        self._advance(held)

    async def _refused(self, entry: Entry, info: BatchInfo) -> None:
        """A batch failed at validation: its calls wait (a token limit) or the run halts."""
        for held in self.window.carried(entry):
            held.token = None
            self._release(held)
        await self.batches.refused(entry, info)

    # -- sending -------------------------------------------------------------------------------

    async def _submit(self) -> None:
        """Send the next call of every record waiting for one, within the budget and limits."""
        await self.batches.retry_creates()
        by_side: dict[str, list[tuple[Held, bytes, int]]] = {}
        blocked = 0
        for held in self.window.ready():
            call, attempts = held.call, held.attempts
            assert call is not None and attempts is not None
            side = self.sides.side(call.role)
            if side.name in self.batches.blocked:
                continue
            level = attempts.level(self.formats)
            sent, extra = self.formats.request(call.request.messages, call.request.schema, level)
            window = self.settings.context_tokens or context_window(side.model)
            too_long = None if window is None else overflow(sent, window, side.model)
            if too_long is not None:  # fails unsent, as a real-time call would
                self._finish(
                    held, call_failed(self.session.job, held.record, held.steps, call, too_long)
                )
                continue
            if held.reservation is None and not self._reserve(held, side, sent, call):
                blocked += 1
                continue
            body = request_body(side.model, sent, call.request, extra)
            if len(body) + LINE_OVERHEAD > self.config.max_bytes:
                self._too_large(held, call, sent, side, len(body))
                continue
            by_side.setdefault(side.name, []).append((held, body, level))
        round_ = self.ledger.state.rounds + 1
        for name, members in by_side.items():
            side = self.sides.named(name)
            max_lines = self.batches.max_lines(name, self.config.max_lines)
            sizes = [len(body) + LINE_OVERHEAD for _, body, _ in members]
            for start, end in split(sizes, max_lines, self.config.max_bytes):
                await self.batches.send(side, round_, members[start:end])
        outstanding = self.ledger.state.entries or self.window.in_batches()
        if blocked and not by_side and not outstanding:
            raise BudgetReached(
                f"budget reached: ${self.session.budget.spent:.4f} of --budget "
                f"${self.settings.budget:g} spent; {blocked} call(s) cannot be paid for even "
                "at Batch API prices. Re-run with a larger --budget to continue"
            )

    def _reserve(self, held: Held, side: Side, sent: list[dict[str, str]], call: Call) -> bool:
        """Hold the call's worst case at Batch API prices; False when it does not fit."""
        budget = self.session.budget
        tokens = call.request.max_tokens
        amount = budget.worst_case(side.model, estimate_tokens(sent), tokens, batch=True)
        if amount is None:
            budget.unknown = True
            return True
        held.reservation = budget.try_reserve(side.model, amount, batch=True)
        return held.reservation is not None

    def _too_large(
        self, held: Held, call: Call, sent: list[dict[str, str]], side: Side, size: int
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
