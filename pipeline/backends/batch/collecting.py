"""The Batch API driver's collecting half: batches polled, their lines applied as steps."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from ...client.retry import OutageState, decide
from ...core.loop import call_failed, make_step
from ...core.steps import Completion, Try
from ...errors import BatchFailed, CallError, StoreError
from .api import BatchInfo, Side
from .ledger import Entry
from .lines import Answer, read_output, read_result

if TYPE_CHECKING:
    pass


from .base import _Base, _Held

log = logging.getLogger("refine")

# Lines checkpointed at once when a batch ends (the journal groups their writes).
APPLY_AT_ONCE = 256


class _Collecting(_Base):
    """Looks at the batches in flight and checkpoints what ended ones answered."""

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
