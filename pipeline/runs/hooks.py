"""A run's watch on its job's hooks: failures counted, and a hook broken for good stops it.

A hook that raises (or breaks its return contract) on one answer is recorded on that
answer's step and the run goes on (``core.hooks``). A hook that fails on each of the
first ``STRIKES`` answers it judges in an invocation, with none judged well, is taken
for broken: the run stops (exit 2) naming the hook, the job and its last failure, rather
than paying for every record's calls with an evaluator or a check that does nothing.
"""

from __future__ import annotations

from collections import Counter

from ..core.hooks import Hook, HookFailure
from ..core.jobs import Job
from ..core.steps import Step
from ..errors import JobError

__all__ = ["STRIKES", "HookWatch"]

STRIKES = 5  # answers in a row, from the first, a hook must fail on to stop the run


class HookWatch:
    """Counts each hook's failures and successes over the answers saved in an invocation."""

    __slots__ = ("_checks", "_job", "failed", "last", "passed")

    def __init__(self, job: Job, checks: bool) -> None:
        self._job = job
        self._checks = checks
        self.failed: Counter[str] = Counter()
        self.passed: Counter[str] = Counter()
        self.last: dict[Hook, HookFailure] = {}

    def _judged(self, step: Step) -> tuple[Hook, ...]:
        """The hooks that ran on this step: an answer that was checked or measured."""
        if step.role == "feedback" or step.superseded or step.failed:
            return ()
        ran: list[Hook] = []
        failed = {f.hook for f in step.hook_errors}
        if self._job.evaluator is not None and (
            step.metrics is not None or Hook.EVALUATE in failed
        ):
            ran.append(Hook.EVALUATE)
        if self._job.checker is not None and self._checks and step.checks is not None:
            ran.append(Hook.CHECK)
        return tuple(ran)

    def saw(self, step: Step) -> JobError | None:
        """Count a saved step; the error that stops the run when a hook is broken for good."""
        failed = {f.hook: f for f in step.hook_errors}
        for hook in self._judged(step):
            if hook in failed:
                self.failed[hook] += 1
                self.last[hook] = failed[hook]
            else:
                self.passed[hook] += 1
        for hook, failure in self.last.items():
            if self.failed[hook] >= STRIKES and not self.passed[hook]:
                return JobError(
                    self._job.source,
                    "hooks.file",
                    f"{hook} failed on each of the first {self.failed[hook]} answers (the "
                    f"last: {failure.message}); fix it, then start the run over (another "
                    "--out: the job's hooks are part of the run)",
                )
        return None
