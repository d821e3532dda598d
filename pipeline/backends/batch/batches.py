"""The run's batches: the ledger and the provider kept in step, so a kill repeats no call.

Every batch is journaled before anything is sent (its intent: token, side, calls), its
input file and id as soon as they exist, its collection once its lines are checkpointed,
and it is forgotten once its files are deleted. An intent whose id was never recorded is
looked for by its token before anything is sent again (adopted, or forgotten with its
input file); a creation refused for a queue limit is asked again at the next poll, one
whose answer was lost is looked for first. The records the calls belong to are the
driver's: this side only gives a forgotten batch's calls back to the window.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import BatchFailed, CallError, FatalCallError, UnavailableError
from .api import TOKEN_KEY, BatchInfo, Side, Sides, Undecided, input_file_name
from .control import Control
from .ledger import Entry, Ledger
from .lines import custom_id, input_line, read_output
from .window import Held, Window

__all__ = ["Batches"]

log = logging.getLogger("refine")


class Batches:
    """The batches the ledger holds open, and what each is waiting for."""

    __slots__ = (
        "blocked",
        "cap",
        "clock",
        "control",
        "ledger",
        "poll",
        "rate_limited",
        "retry_create",
        "run_name",
        "sides",
        "status",
        "unsure",
        "window",
    )

    def __init__(
        self,
        ledger: Ledger,
        control: Control,
        window: Window,
        *,
        run_name: str,
        poll: float,
        clock: Callable[[], float],
    ) -> None:
        self.ledger = ledger
        self.control = control
        self.sides: Sides = control.sides
        self.window = window  # given a forgotten batch's calls back
        self.run_name = run_name[:500]  # the run directory's name, in each batch's metadata
        self.poll = poll
        self.clock = clock
        self.status: dict[str, str] = {}  # token -> the batch's last known status
        self.retry_create: dict[str, float] = {}  # token -> when to ask again (refused)
        self.unsure: set[str] = set()  # tokens whose creation may have happened
        self.blocked: set[str] = set()  # sides waiting for a batch to end (token limit)
        self.cap: dict[str, int] = {}  # lines a file by side, halved after a token limit
        self.rate_limited = 0  # batch creations refused for a queue or token limit

    def open_entries(self) -> list[Entry]:
        """The batches not yet forgotten."""
        return list(self.ledger.state.entries.values())

    def known(self) -> frozenset[str]:
        """The ids of the batches the ledger holds."""
        entries = self.ledger.state.entries.values()
        return frozenset(e.batch_id for e in entries if e.batch_id is not None)

    def max_lines(self, side: str, limit: int) -> int:
        """Lines a file for ``side`` may hold: ``limit``, less after a token-limit refusal."""
        return min(limit, self.cap.get(side, limit))

    # -- finding and forgetting ----------------------------------------------------------------

    async def reconcile(self) -> None:
        """Adopt the batches of intents whose id was never recorded; forget the rest."""
        unsure = [e for e in self.ledger.state.entries.values() if e.batch_id is None]
        if not unsure:
            return
        try:
            found = await self.control.find(unsure, self.known())
        except Undecided as err:
            raise UnavailableError(
                "unavailable",
                f"a batch of an earlier stop may have been created and cannot be found yet "
                f"({err}); nothing is sent again meanwhile: run the same command again once "
                "it has ended (resumable)",
            ) from err
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
                await self.forget(e, "never created")

    async def forget(self, entry: Entry, why: str) -> None:
        """Close a batch that does not exist: delete its input file, give its calls back."""
        for held in self.window.carried(entry):
            held.token = None
        if entry.file_id is None:  # uploaded, maybe, but never journaled: found by its name
            name = input_file_name(entry.token)
            for file_id in await self.control.find_upload(entry):
                log.warning(
                    "file %s (%s) was uploaded but never used; it is deleted", file_id, name
                )
                self.ledger.uploaded(entry.token, file_id)
        await self.delete_files(entry, why)

    async def delete_files(self, entry: Entry, why: str) -> None:
        """Delete a batch's files and forget it (left open when a deletion must wait)."""
        if await self.control.delete_files(entry):
            self.ledger.closed(entry.token, why)
            self.status.pop(entry.token, None)

    # -- looking and collecting ----------------------------------------------------------------

    async def look(self, entry: Entry) -> BatchInfo | None:
        """An ended batch, to collect; None when there is nothing to collect now (files of a
        collected one deleted, not created yet, gone, in flight, or the look failed)."""
        if entry.collected:
            await self.delete_files(entry, "collected")
            return None
        if entry.batch_id is None:
            return None
        api = self.sides.named(entry.side).api
        try:
            async with self.control.polls:
                info = await api.retrieve(entry.batch_id)
        except CallError as err:
            if err.status == 404:
                log.warning("batch %s is gone (404); its calls go out again", entry.batch_id)
                await self.forget(entry, "gone")
                return None
            self.control.failed(err, f"retrieving batch {entry.batch_id}")
            return None
        self.control.ok()
        self.status[entry.token] = info.status
        return info if info.terminal else None

    async def results(self, entry: Entry, info: BatchInfo) -> dict[int, Mapping[str, Any]] | None:
        """An ended batch's lines by position; None when a download failed (collected at a
        later poll). A file that is gone leaves its lines unanswered: they go out again."""
        api = self.sides.named(entry.side).api
        results: dict[int, Mapping[str, Any]] = {}
        for file_id in _files(info):
            try:
                async with self.control.polls:
                    data = await api.content(file_id)
            except CallError as err:
                if err.status == 404:  # gone (files expire): its lines count as never answered
                    log.warning(
                        "file %s of batch %s is gone; its lines go out again", file_id, info.id
                    )
                    continue
                self.control.failed(err, f"downloading file {file_id} of batch {info.id}")
                return None
            for index, line in read_output(data, entry.token):
                results.setdefault(index, line)  # a line the provider sent twice counts once
        return results

    async def collected(
        self, entry: Entry, info: BatchInfo, failed: list[tuple[str, int, int | str]]
    ) -> None:
        """Record a batch whose lines are checkpointed (its failed calls counted), then
        delete its files; a side it blocked may send again."""
        self.ledger.collected(entry.token, info.status, failed, _files(info))
        self.blocked.discard(entry.side)
        await self.delete_files(entry, "collected")

    async def refused(self, entry: Entry, info: BatchInfo) -> None:
        """A batch that failed validation: a token limit waits; anything else stops the run."""
        self.ledger.collected(entry.token, info.status, [], [])
        await self.delete_files(entry, "failed")
        if any(issue.code == "token_limit_exceeded" for issue in info.errors):
            self.rate_limited += 1
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

    async def send(
        self, side: Side, round_: int, members: Sequence[tuple[Held, bytes, int]]
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
            async with self.control.creates:
                file_id = await side.api.upload(input_file_name(token), data)
        except CallError as err:
            await self.forget(entry, "upload failed")
            self.control.failed(err, "uploading a batch input file")
            return
        self.control.ok()
        self.ledger.uploaded(token, file_id)
        self.status[token] = "creating"
        await self.create(entry)

    async def create(self, entry: Entry) -> None:
        """Create the batch of an uploaded intent, and record its id."""
        side = self.sides.named(entry.side)
        assert entry.file_id is not None
        metadata = {
            TOKEN_KEY: entry.token,
            "refine_round": str(entry.round),
            "refine_run": self.run_name,
        }
        try:
            async with self.control.creates:
                info = await side.api.create(entry.file_id, metadata)
        except CallError as err:
            if isinstance(err, FatalCallError):
                raise
            if err.status == 429:  # a queue or rate limit: the same batch is asked for later
                self.rate_limited += 1
                self.retry_create[entry.token] = self.clock() + self.poll
                log.info("batch creation refused (%s); asking again at the next poll", err)
                return
            if err.status is not None and err.status < 500:
                await self.forget(entry, "refused")
                raise BatchFailed(f"creating a batch: the Batch API refused it ({err})") from err
            # Sent, but the answer was lost: the batch may exist. Looked for before asking again.
            self.unsure.add(entry.token)
            self.control.failed(err, "creating a batch")
            return
        self.ledger.created(entry.token, info.id)
        self.status[entry.token] = info.status
        self.control.ok()

    async def retry_creates(self) -> None:
        """Ask again for batches whose creation was refused, or whose outcome was lost."""
        entries = self.ledger.state.entries
        if self.unsure:
            unsure = [entries[t] for t in self.unsure if t in entries]
            self.unsure.clear()
            try:
                found = await self.control.find(unsure, self.known())
            except Undecided as err:  # asked again at the next poll; nothing sent meanwhile
                self.unsure.update(e.token for e in unsure)
                log.info("a batch whose creation went unanswered is not found yet: %s", err)
                return
            except CallError as err:
                self.unsure.update(e.token for e in unsure)
                self.control.failed(err, "listing batches")
                return
            for e in unsure:
                info = found.get(e.token)
                if info is not None:
                    self.ledger.created(e.token, info.id)
                else:
                    await self.create(e)
        now = self.clock()
        for token, at in list(self.retry_create.items()):
            if at <= now and token in entries:
                del self.retry_create[token]
                await self.create(entries[token])


def _files(info: BatchInfo) -> list[str]:
    """An ended batch's output and error files, those it has."""
    return [f for f in (info.output_file_id, info.error_file_id) if f]
