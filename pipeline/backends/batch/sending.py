"""The Batch API driver's sending half: the next call of every waiting record, in batches."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING

import orjson

from ...client.context import context_window, overflow
from ...client.limits import estimate_tokens
from ...core.loop import Call, call_failed
from ...errors import BatchFailed, BudgetReached, CallError, FatalCallError
from .api import TOKEN_KEY, Side, input_file_name
from .ledger import Entry
from .lines import LINE_OVERHEAD, custom_id, input_line, split

if TYPE_CHECKING:
    pass


from .base import _Base, _Held

log = logging.getLogger("refine")


class _Sending(_Base):
    """Sends the next call of every record waiting for one, within the budget and limits."""

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
        self._crash("before_create")
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
