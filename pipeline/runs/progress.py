"""Progress: a tqdm bar on a terminal, plain periodic log lines otherwise (cron, CI)."""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["Counters", "Progress"]

log = logging.getLogger("refine")


@dataclass(slots=True)
class Counters:
    """Live figures of a run, shared by the pool, the progress display and ``status``."""

    lines: int | None = None  # input lines this run covers (up to --limit), once counted
    already: int = 0  # records finished by an earlier invocation
    done: int = 0
    failed: int = 0
    bad_lines: int = 0
    in_flight: int = 0
    calls: int = 0
    retries: int = 0
    rate_limited: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    spent_usd: float | None = 0.0  # dollars spent by the run so far (None: a price is unknown)
    spent_before: float | None = 0.0  # of them, by earlier invocations
    batches: dict[str, int] = field(default_factory=dict)  # --batch: open batches by status
    waiting: dict[str, int] = field(default_factory=dict)  # --batch: held records by next step
    hook_errors: Counter[str] = field(default_factory=Counter)  # answers each hook failed on
    started: float = field(default_factory=time.monotonic)

    @property
    def total(self) -> int | None:
        """Records this run ends with, once the input is counted: its lines less the bad ones."""
        return None if self.lines is None else self.lines - self.bad_lines

    def cost_text(self) -> str:
        """Dollars the run has spent so far, for people."""
        return "cost unknown" if self.spent_usd is None else f"${self.spent_usd:.4f}"

    def invocation_cost_text(self) -> str:
        """Dollars this invocation spent, for people."""
        if self.spent_usd is None or self.spent_before is None:
            return "cost unknown"
        return f"${max(0.0, self.spent_usd - self.spent_before):.4f}"

    def hooks_text(self) -> str:
        """``; hook errors: check on 3 answers`` when a hook failed, else empty."""
        if not self.hook_errors:
            return ""
        failed = ", ".join(f"{h} on {n} answer(s)" for h, n in sorted(self.hook_errors.items()))
        return f"; hook errors: {failed}"

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able copy for ``progress.json``."""
        elapsed = time.monotonic() - self.started
        return {
            "total": self.total,
            "finished_before": self.already,
            "done": self.done,
            "failed": self.failed,
            "bad_lines": self.bad_lines,
            "in_flight": self.in_flight,
            "calls": self.calls,
            "retries": self.retries,
            "rate_limited": self.rate_limited,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "spent_usd": self.spent_usd,
            "spent_before_usd": self.spent_before,
            "elapsed_s": round(elapsed, 1),
            "calls_per_s": round(self.calls / elapsed, 2) if elapsed > 0 else 0.0,
            "batches": dict(self.batches),
            "waiting": dict(self.waiting),
            "hook_errors": dict(self.hook_errors),
        }

    def batch_text(self) -> str:
        """``--batch``: open batches by status and held records by next step (else empty)."""
        if not self.batches and not self.waiting:
            return ""
        batches = ", ".join(f"{n} {s}" for s, n in sorted(self.batches.items())) or "none"
        steps = ", ".join(f"{n} {r}" for r, n in sorted(self.waiting.items())) or "none"
        return f"; batches: {batches}; next step: {steps}"

    def line(self) -> str:
        """One human line of the figures: the run's records and cost, and what this
        invocation did (records finished, calls, tokens, cost)."""
        s = self.snapshot()
        of = f"/{self.total}" if self.total is not None else ""
        return (
            f"{self.already + self.done + self.failed}{of} records finished; this invocation: "
            f"{self.done} done, {self.failed} failed, {self.in_flight} in flight, "
            f"{self.calls} calls, {self.prompt_tokens + self.completion_tokens} tokens, "
            f"{self.invocation_cost_text()}, {s['calls_per_s']} calls/s; "
            f"run total: {self.cost_text()}{self.hooks_text()}{self.batch_text()}"
        )


class Progress:
    """Shows ``Counters`` while a run goes on."""

    def __init__(
        self,
        counters: Counters,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.c = counters
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.interval_s = interval_s
        self._clock = clock
        self._last_log = clock()
        self._bar: tqdm[Any] | None = None
        if enabled and self.stream.isatty():
            self._bar = tqdm(
                total=counters.total,
                initial=counters.already,
                unit="rec",
                file=self.stream,
                dynamic_ncols=True,
                smoothing=0.1,
            )

    def tick(self) -> None:
        """Refresh the bar, or log a line when the interval has passed."""
        if not self.enabled:
            return
        if self._bar is not None:
            finished = self.c.already + self.c.done + self.c.failed
            self._bar.total = self.c.total
            self._bar.n = finished
            s = self.c.snapshot()
            self._bar.set_postfix_str(
                f"done={self.c.done} failed={self.c.failed} calls={self.c.calls} "
                f"tok={self.c.prompt_tokens + self.c.completion_tokens} "
                f"{self.c.cost_text()} {s['calls_per_s']}call/s{self.c.batch_text()}",
                refresh=False,
            )
            self._bar.refresh()
            return
        now = self._clock()
        if now - self._last_log >= self.interval_s:
            self._last_log = now
            log.info("%s", self.c.line())

    def close(self) -> None:
        """Final refresh; close the bar."""
        if self._bar is not None:
            self.tick()
            self._bar.close()
            self._bar = None
