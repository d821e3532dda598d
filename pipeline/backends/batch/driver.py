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
from typing import TYPE_CHECKING

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from ...client.limits import estimate_tokens
from ...core.records import Record
from ...core.steps import Try
from ...errors import (
    BatchFailed,
    BudgetReached,
    CallError,
    ConfigError,
    FatalCallError,
    RefineError,
    StoreError,
    UnavailableError,
)
from ...runs.clients import Models
from ...runs.session import Session, StopReason, stop_reason_of
from .api import BatchClients

if TYPE_CHECKING:
    pass

from .base import _Held
from .collecting import _Collecting
from .sending import _Sending

__all__ = ["run_batches"]

log = logging.getLogger("refine")


async def run_batches(session: Session, models: Models) -> None:
    """The Batch API driver (``--batch``): every call of the run through batches."""
    if not isinstance(models.batch, BatchClients):
        raise ConfigError("--batch needs the Batch API clients of the run")
    driver = _Driver(session, models.batch)
    try:
        await driver.run()
    finally:
        driver.ledger.close()


class _Driver(_Collecting, _Sending):
    """The rounds: fill the window, look at the batches in flight, send the next calls."""

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
