"""The Batch API driver's control requests: paced, and their failures waited out.

Uploads and creations go at ``creates_per_s``, everything else (retrieves, listings,
downloads, deletions) at ``polls_per_s``, each strictly 1/rate apart: no burst. A failed
control request is tried again at the next poll (the driver is the one retry layer of
the Batch API); ``failed`` stops the run at once on a fatal error or a refusal, and once
retryable failures have gone on for longer than --max-outage. Finding a batch by its
intent's token, an input file by its name, and deleting a batch's files go through here;
what they find or delete is the driver's to record in the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from aiolimiter import AsyncLimiter

from ...client.retry import retryable
from ...errors import BatchFailed, CallError, FatalCallError, UnavailableError
from .api import BatchInfo, Sides, find_by_token, find_upload, input_file_name
from .config import BatchConfig
from .ledger import Entry

__all__ = ["Control"]

log = logging.getLogger("refine")


class Control:
    """The control plane of one run: its endpoints by side, their pacing, their outage."""

    __slots__ = ("clock", "creates", "failing_since", "max_outage", "polls", "sides")

    def __init__(
        self, sides: Sides, config: BatchConfig, clock: Callable[[], float], max_outage: float
    ) -> None:
        self.sides = sides
        self.clock = clock
        self.max_outage = max_outage
        self.failing_since: float | None = None
        self.creates = AsyncLimiter(1, 1 / config.creates_per_s)
        self.polls = AsyncLimiter(1, 1 / config.polls_per_s)

    def ok(self) -> None:
        """A control request succeeded: any outage is over."""
        self.failing_since = None

    def failed(self, err: CallError, what: str) -> None:
        """A control request failed: tried again at the next poll, until --max-outage."""
        if isinstance(err, FatalCallError):
            raise err
        if not retryable(err):
            raise BatchFailed(f"{what}: the Batch API refused it ({err})") from err
        now = self.clock()
        if self.failing_since is None:
            self.failing_since = now
        log.warning("%s failed (%s); trying again at the next poll", what, err)
        if now - self.failing_since > self.max_outage:
            raise UnavailableError(
                "unavailable",
                f"the Batch API has been failing for {now - self.failing_since:.0f} s "
                f"(last: {err}); stopped, resumable",
                status=err.status,
            ) from err

    async def find(
        self, entries: Sequence[Entry], known: frozenset[str] = frozenset()
    ) -> dict[str, BatchInfo]:
        """The batches of these intents that exist, found by their tokens (``known``: the
        ids of the run's batches, none of them the intents'); ``api.Undecided`` while one
        that may be an intent's cannot be told yet."""
        found: dict[str, BatchInfo] = {}
        by_side: dict[str, list[Entry]] = {}
        for e in entries:
            by_side.setdefault(e.side, []).append(e)
        for name, group in by_side.items():
            api = self.sides.named(name).api
            since = min(e.at for e in group)
            tokens = {e.token for e in group}
            found |= await find_by_token(api, tokens, since, self.polls.acquire, known)
        return found

    async def find_upload(self, entry: Entry) -> list[str]:
        """The input files of an intent whose upload was never journaled (the run stopped,
        or the upload's answer was lost, after the file arrived); none when the files
        cannot be listed now."""
        api = self.sides.named(entry.side).api
        name = input_file_name(entry.token)
        try:
            return await find_upload(api, name, entry.at, self.polls.acquire)
        except CallError as err:
            if isinstance(err, FatalCallError):
                raise
            log.warning("cannot list files to find %s (%s); if uploaded, it is left", name, err)
            return []

    async def delete_files(self, entry: Entry) -> bool:
        """Delete a batch's files; False when a failure that may pass stopped it (the
        entry stays open, deleted at a later poll)."""
        api = self.sides.named(entry.side).api
        for file_id in entry.files:
            try:
                async with self.polls:
                    await api.delete(file_id)
            except CallError as err:
                if retryable(err) or isinstance(err, FatalCallError):
                    self.failed(err, f"deleting file {file_id}")
                    return False
                # A server that cannot delete files must not stop the run over it.
                log.warning("file %s could not be deleted (%s); it is left in place", file_id, err)
        return True
