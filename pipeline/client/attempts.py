"""A call's attempts: the one retry sequence, for real-time calls and Batch API lines alike.

This is the package's one retry layer: the openai SDK is built with ``max_retries=0``; the
real-time client (``chat``) hands every failed attempt of a call, and the Batch API
driver every failed line of a batch, to the call's ``Attempts``, which says what follows:

- ``StepDown``: the endpoint refused the structured-output format: ask again at a lower
  level (``formats``); no attempt is used up;
- ``Retry``: ask again after ``delay`` seconds; ``counted`` when the attempt used up one of
  the call's retries (a fault of an endpoint in an outage uses up none);
- ``FailRecord``: the call failed for good, and with it its record;
- ``HaltRun``: the failure would meet every record (the key refused, an unknown model, an
  outage past --max-outage): the run stops, its records resumable.

The last two carry the error the call ends with, built whole with the call's trace data
(``CallError.traced``: every try, the messages as last sent, the model), and the attempt's
own failure to raise it from. Every failed attempt shows in the call's trace, a format
refusal too. The policy is ``retry.decide``'s; an ``Attempts`` only keeps the call's state
(its tries, the retries it used, its format floor), does no I/O and never sleeps, so a
driver that keeps a call across rounds, as the Batch API driver keeps a line across
batches, keeps its ``Attempts`` with it (and, resuming, builds it from the retries it
counted: ``tries`` and ``counted``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from ..core.steps import Try
from ..errors import CallError, FatalCallError
from .delays import DELAYS, Delays
from .formats import FormatLadder
from .outage import unavailable_error
from .retry import OutageState, decide

__all__ = ["Attempts", "FailRecord", "HaltRun", "Retry", "StepDown", "Verdict"]

_E = TypeVar("_E", bound=CallError)


@dataclass(frozen=True, slots=True)
class StepDown:
    """Ask again at structured-output ``level``: the format was refused (no attempt used)."""

    level: int


@dataclass(frozen=True, slots=True)
class Retry:
    """Ask again after ``delay`` seconds; ``counted``: the attempt used up one retry."""

    delay: float
    counted: bool


@dataclass(frozen=True, slots=True)
class FailRecord:
    """The call failed for good: ``error`` (with its trace data), raised from ``cause``."""

    error: CallError
    cause: CallError


@dataclass(frozen=True, slots=True)
class HaltRun:
    """The run must stop: ``error`` (with its trace data), raised from ``cause``."""

    error: FatalCallError
    cause: CallError


Verdict = StepDown | Retry | FailRecord | HaltRun


def _closed(failure: CallError) -> OutageState:
    """The breaker of a driver that keeps none: never open."""
    return OutageState()


def _no_jitter() -> float:
    """Jitter for a driver that waits by rounds, not by delays."""
    return 0.0


class Attempts:
    """One call's attempts so far, and what follows each failed one."""

    __slots__ = ("_delays", "_max_retries", "_model", "counted", "floor", "tries")

    def __init__(
        self,
        model: str,
        max_retries: int,
        delays: Delays = DELAYS,
        *,
        tries: Iterable[Try] = (),
        counted: int = 0,
        floor: int = 0,
    ) -> None:
        self._model = model  # as the run records it: the trace data's model
        self._max_retries = max_retries
        self._delays = delays
        self.tries: list[Try] = list(tries)  # every attempt's status and latency, in order
        self.counted = counted  # failed attempts that used up one of the call's retries
        self.floor = floor  # the call's own structured-output level, after a bare 400

    def level(self, ladder: FormatLadder) -> int:
        """The structured-output level of the next attempt: the pool's, or the call's floor."""
        return max(ladder.level, self.floor)

    def failed(self, failure: CallError, latency_s: float) -> None:
        """Note a failed attempt: it shows in the call's trace, whatever follows."""
        self.tries.append(Try(failure.status or failure.category, latency_s))

    def succeeded(self, latency_s: float) -> tuple[Try, ...]:
        """Note the attempt that succeeded; the tries its trace shows (none: the first did)."""
        self.tries.append(Try(200, latency_s))
        return tuple(self.tries) if len(self.tries) > 1 else ()

    def after(
        self,
        failure: CallError,
        sent: list[dict[str, str]],
        level: int,
        *,
        ladder: FormatLadder | None = None,
        code: str | None = None,
        param: str | None = None,
        wait: float | None = None,
        outage: Callable[[CallError], OutageState] = _closed,
        jitter: Callable[[], float] = _no_jitter,
    ) -> Verdict:
        """What follows ``failure``, an attempt that sent ``sent`` at structured ``level``.

        ``ladder`` is given when the call asks for structured output; ``code`` and ``param``
        are the error's (OpenAI's envelope), ``wait`` the server's Retry-After. ``outage``
        counts the failure on the endpoint's breaker and says its state (it is not asked
        about a format refusal); ``jitter`` draws a number in [0, 1] for the backoff.
        """
        if ladder is not None and failure.status is not None:
            lower = ladder.refused(failure.status, str(failure), level, code=code, param=param)
            if lower is not None:
                self.floor = lower
                return StepDown(lower)
        state = outage(failure)
        decision = decide(
            failure,
            attempt=self.counted + 1,
            max_retries=self._max_retries,
            outage=state,
            rand=jitter(),
            wait=wait,
            delays=self._delays,
        )
        if decision.action == "retry":
            if decision.counted:
                self.counted += 1
            return Retry(decision.delay, decision.counted)
        if decision.action == "fail":
            return FailRecord(self.final(failure, sent), failure)
        if isinstance(failure, FatalCallError):
            return HaltRun(self.final(failure, sent), failure)
        return HaltRun(self.final(unavailable_error(state.duration_s, failure), sent), failure)

    def final(self, error: _E, sent: list[dict[str, str]]) -> _E:
        """``error`` built whole with the call's trace data (raise it from the attempt's
        failure): every try so far, the messages as last sent, the model."""
        return error.traced(
            attempts=len(self.tries), tries=tuple(self.tries), messages=sent, model=self._model
        )
