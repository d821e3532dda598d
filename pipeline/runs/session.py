"""One invocation of a run: its files, counters, budget, halt state and record stream.

``Session`` is what every backend's driver (real time, Batch API, Ray) runs records
through: the records to run (finished ones skipped, bad lines to errors.jsonl), the journal
every step goes to, the outputs a finished record goes to, progress, and why the run
halted (``Halt``), with the exit status that maps to. ``CallCounts`` is what a driver reports of its
clients for progress and the summary.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import anyio

from ..client.budget import Budget
from ..client.prices import PriceBook
from ..core.jobs import Job
from ..core.loop import Policy
from ..core.records import Record
from ..core.steps import Outcome, Step
from ..errors import AuthError, BudgetReached, ConfigError, InputError, StoreError, UnavailableError
from ..io.records import count_records, read_records
from .exits import EXIT
from .hooks import HookWatch
from .journal import Journal
from .manifest import Manifest
from .outputs import Outputs
from .progress import Counters, Progress
from .rundir import RunDir
from .shards import shard_of
from .tally import tally
from .traces import read_traces, resumable

__all__ = [
    "EXIT",
    "CallCounts",
    "CountingSink",
    "Halt",
    "Halting",
    "Rejected",
    "RunSummary",
    "Session",
    "conclude",
    "halt_of",
]

log = logging.getLogger("refine")

# Exit statuses (documented in the README and `refine --help`).
READ_BATCH = 256

PROGRESS_EVERY_S = 1.0


class Halt(enum.Enum):
    """Why a run halted before finishing its records, with the exit status it maps to."""

    AUTH = "auth"
    UNAVAILABLE = "unavailable"
    FATAL = "config"  # an error every record would hit (unknown model, wrong URL)
    STORE = "store"
    BUDGET = "budget"
    DETACHED = "detached"
    SIGNAL = "interrupted"

    @property
    def exit_code(self) -> int:
        """The process exit status."""
        return EXIT[self.value]


@dataclass(frozen=True, slots=True)
class CallCounts:
    """What a driver's clients did: calls made, calls retried, requests refused for a rate
    limit (on Ray, every worker's; with --batch, lines answered, lines sent again and
    batch creations refused)."""

    calls: int = 0
    retries: int = 0
    rate_limited: int = 0


@dataclass(slots=True)
class RunSummary:
    """What a run did, and the exit status it maps to (``pipeline.run`` returns it however
    a run it started ends; what stops a run from starting is raised instead)."""

    run_dir: Path
    counters: Counters  # this invocation's figures; ``spent_usd`` is the run's in all
    exit_code: int = 0  # the ``refine`` command's exit status (README's table)
    state: str = "finished"  # finished, stopped, interrupted or waiting (--detach)
    message: str | None = None  # why it stopped, or what is left to do, for people
    error: BaseException | None = None  # the error that stopped it (None: it finished)


@dataclass(slots=True)
class Halting:
    """The first reason the run was told to halt, and the error that said so."""

    reason: Halt | None = None
    error: BaseException | None = None

    def set(self, reason: Halt, error: BaseException) -> None:
        """Record a reason to halt; the first one wins."""
        if self.reason is None:
            self.reason, self.error = reason, error

    @property
    def requested(self) -> bool:
        """Whether the run has been told to halt."""
        return self.reason is not None


def halt_of(err: BaseException) -> Halt:
    """The halt an error that ends the run maps to."""
    if isinstance(err, AuthError):
        return Halt.AUTH
    if isinstance(err, UnavailableError):
        return Halt.UNAVAILABLE
    if isinstance(err, StoreError):
        return Halt.STORE
    if isinstance(err, BudgetReached):
        return Halt.BUDGET
    return Halt.FATAL


def conclude(halting: Halting, failed: int, bad: int) -> tuple[str, int, str | None]:
    """The run's final state, exit status and message."""
    reason, err = halting.reason, halting.error
    if reason is Halt.SIGNAL:
        return (
            "interrupted",
            reason.exit_code,
            f"interrupted ({err}); every completed call is saved: "
            "run the same command again, or `refine resume`, to continue",
        )
    if reason is Halt.BUDGET:
        return "stopped", reason.exit_code, f"stopped: {err}"
    if reason is Halt.DETACHED:
        return "waiting", reason.exit_code, str(err)
    if reason is not None:
        return "stopped", reason.exit_code, f"stopped: {err}"
    if failed or bad:
        parts = []
        if failed:
            parts.append(
                f"{failed} failed record(s) (outputs.jsonl says why; a run with "
                "--retry-failed runs them again)"
            )
        if bad:
            parts.append(
                f"{bad} unreadable input line(s) (errors.jsonl says why; fix them in the "
                "input, in place, and the next run reads them again)"
            )
        return "finished", EXIT["partial"], "finished with " + " and ".join(parts)
    return "finished", EXIT["ok"], None


class Session:
    """One invocation of a run: its files, counters, budget, halt state and record stream."""

    def __init__(
        self,
        job: Job,
        input_path: Path,
        rd: RunDir,
        manifest: Manifest,
        prices: PriceBook,
        show_progress: bool,
    ) -> None:
        self.job = job
        self.input_path = input_path
        self.rd = rd
        self.manifest = manifest
        self.settings = manifest.settings
        self.policy = Policy(
            self.settings.max_iters or 0, self.settings.min_iters, self.settings.checks
        )
        self.prices = prices
        self.model_for = {
            "generate": manifest.model,
            "refine": manifest.model,
            "feedback": manifest.critic,
        }
        self.halting = Halting()
        self.outputs = Outputs(rd.path, log.warning)
        self.outputs.sync()  # what the journal may drop below must be on disk first
        self.journal = Journal(
            rd.journal_path, fsync=self.settings.fsync, durable=self.outputs.sync_records
        )
        self._reopen_failed()
        self.prior = self.journal.load(self.outputs.finished, log.warning)
        self.journal.open()
        used = tally(rd.outputs_path, self.prior, prices, self.model_for)
        self.budget = Budget(self.settings.budget, prices, spent=used.cost_usd or 0.0)
        self.budget.unknown = used.cost_usd is None
        self.counters = Counters(already=len(self.outputs.finished))
        self.counters.spent_before = self.budget.total()
        self.progress = Progress(self.counters, enabled=show_progress)
        self.live: dict[str, Any] = {}  # a driver's own live figures for progress.json
        self.hooks = HookWatch(job, self.settings.checks)
        self._lines_seen = 0
        self._scope: anyio.CancelScope | None = None  # the run's, once supervised

    def _reopen_failed(self) -> None:
        """With --retry-failed: take the failed records back, to resume from their traced
        calls (journaled again before their lines go, so a kill loses none)."""
        if not self.settings.retry_failed:
            return
        ids = self.outputs.failed_ids()
        if ids:
            traced = read_traces(self.rd.traces_path, ids, log.warning)
            self.journal.restore({rid: resumable(s) for rid, s in traced.items()}, log.warning)
            self.outputs.reopen(ids)
            log.info("retrying %d failed record(s) from their last completed call", len(ids))

    def sink(self) -> CountingSink:
        """Where loops save their steps."""
        return CountingSink(self.journal, self.counters, self.hooks, self.halt)

    def halt(self, err: BaseException) -> None:
        """Halt the run now, records in flight included (they stay pending): exit 2."""
        self.halting.set(Halt.FATAL, err)
        if self._scope is not None:
            self._scope.cancel()

    def take_prior(self, record_id: str) -> list[Step]:
        """The journaled steps of a record (given once: the loop owns them after)."""
        return self.prior.pop(record_id, [])

    def finish(self, outcome: Outcome) -> None:
        """Write a finished record and count it."""
        cost = self.prices.steps_cost(outcome.steps, self.model_for)
        self.outputs.finish(outcome, cost)
        self.journal.finished(outcome.record.id)
        if outcome.status == "done":
            self.counters.done += 1
        else:
            self.counters.failed += 1
            log.debug(
                "record %s (line %d) failed: %s",
                outcome.record.id,
                outcome.record.line,
                outcome.error,
            )

    async def records(self, send: Callable[[Record], Awaitable[None]]) -> None:
        """Stream the records this invocation runs to ``send``; bad lines go to errors.jsonl.

        Records already finished are skipped, as are records of other shards and lines
        past ``--limit`` (which counts input lines, readable or not).
        """
        s = self.settings
        items = read_records(self.input_path, self.job.inputs, s.id_field)
        rejected = Rejected(self.outputs.errors.keys)
        while not self.halting.requested:
            batch: list[Record | InputError] = await anyio.to_thread.run_sync(
                lambda: list(islice(items, READ_BATCH))
            )
            if not batch:
                break
            try:
                for item in batch:
                    if s.limit is not None and self._lines_seen >= s.limit:
                        return
                    self._lines_seen += 1
                    rejected.read(item.line, isinstance(item, InputError))
                    if isinstance(item, InputError):
                        self.counters.bad_lines += 1
                        self.outputs.bad_line(item)
                        continue
                    if s.shard is not None and shard_of(item.id, s.shard[1]) != s.shard[0]:
                        continue
                    if item.id in self.outputs.finished:
                        continue
                    await send(item)
                    if self.halting.requested:
                        return
            finally:
                self._forget_fixed(rejected.take())

    def _forget_fixed(self, lines: set[int]) -> None:
        """Drop input lines rejected before and read now from errors.jsonl."""
        if lines and self.outputs.errors.drop(lines):
            log.info(
                "%d input line(s) rejected by an earlier invocation are read now (fixed in "
                "place): removed from errors.jsonl",
                len(lines),
            )

    async def count_input(self) -> None:
        """Set the progress total once the input is counted (runs beside the records)."""
        try:
            # check_cancelled: the count of a large input stops when the run ends.
            lines = await anyio.to_thread.run_sync(
                count_records, self.input_path, anyio.from_thread.check_cancelled
            )
        except (OSError, ConfigError) as err:
            log.warning("cannot count the lines of %s: %s", self.input_path, err)
            return
        if self.settings.limit is not None:
            lines = min(lines, self.settings.limit)
        if self.settings.shard is None:
            self.counters.lines = lines

    def _count_calls(self, counts: CallCounts) -> None:
        c = self.counters
        c.calls, c.retries, c.rate_limited = counts.calls, counts.retries, counts.rate_limited

    def publish(self, counts: CallCounts) -> None:
        """Refresh the live figures: the progress display and progress.json."""
        c = self.counters
        self._count_calls(counts)
        c.spent_usd = self.budget.total()
        self.progress.tick()
        self.rd.write_progress(
            {"pid": os.getpid(), "state": "running", **c.snapshot(), **self.live}
        )

    async def supervise(
        self,
        counts: Callable[[], CallCounts],
        scope: anyio.CancelScope,
        install_signal_handlers: bool,
    ) -> None:
        """Publish progress every second; with signal handlers, halt cleanly on SIGINT/SIGTERM."""
        self._scope = scope
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.count_input)
            if install_signal_handlers:
                tg.start_soon(self._signals, scope)
            while True:
                self.publish(counts())
                await anyio.sleep(PROGRESS_EVERY_S)

    async def _signals(self, scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
            async for signum in received:
                self.halting.set(Halt.SIGNAL, KeyboardInterrupt(signal.Signals(signum).name))
                scope.cancel()
                return

    def close(self, counts: CallCounts) -> RunSummary:
        """Flush and close the files; the summary of this invocation."""
        self.journal.close()
        c = self.counters
        self._count_calls(counts)
        c.spent_usd = self.budget.total()
        self.progress.close()
        try:
            self.outputs.sync()
        except StoreError:
            pass  # the journal keeps every entry then
        else:
            self.journal.compact()  # what finished is durable: its entries go
        self.outputs.close()
        failed = self.outputs.outputs.counts.get("failed", 0)
        bad = len(self.outputs.errors.keys)
        state, code, message = conclude(self.halting, failed, bad)
        self.rd.write_progress({"pid": os.getpid(), "state": state, **c.snapshot(), **self.live})
        return RunSummary(self.rd.path, c, code, state, message, self.halting.error)


class Rejected:
    """The input lines errors.jsonl holds, and those of them read again without error.

    Lines are read in order; a recorded line passed over is blank now, and one read as a
    record was fixed: either way it is no longer rejected.
    """

    __slots__ = ("_at", "_fixed", "_lines")

    def __init__(self, lines: set[int]) -> None:
        self._lines = sorted(lines)
        self._at = 0
        self._fixed: set[int] = set()

    def read(self, line: int, rejected: bool) -> None:
        """Input ``line`` was read (a record, or an InputError when ``rejected``)."""
        lines = self._lines
        while self._at < len(lines) and lines[self._at] < line:
            self._fixed.add(lines[self._at])
            self._at += 1
        if self._at < len(lines) and lines[self._at] == line:
            if not rejected:
                self._fixed.add(line)
            self._at += 1

    def take(self) -> set[int]:
        """The lines found no longer rejected since the last call."""
        fixed, self._fixed = self._fixed, set()
        return fixed


class CountingSink:
    """The journal, counting each saved call's tokens and hook failures for live progress;
    a hook broken for good halts the run (``HookWatch``)."""

    __slots__ = ("counters", "halt", "hooks", "journal")

    def __init__(
        self,
        journal: Journal,
        counters: Counters,
        hooks: HookWatch,
        halt: Callable[[BaseException], None],
    ) -> None:
        self.journal = journal
        self.counters = counters
        self.hooks = hooks
        self.halt = halt

    async def save(self, record_id: str, earlier: Sequence[Step], step: Step) -> None:
        await self.journal.save(record_id, earlier, step)
        self.counters.prompt_tokens += step.usage.get("prompt_tokens", 0)
        self.counters.completion_tokens += step.usage.get("completion_tokens", 0)
        for failure in step.hook_errors:
            self.counters.hook_errors[str(failure.hook)] += 1
        broken = self.hooks.saw(step)
        if broken is not None:
            self.halt(broken)
