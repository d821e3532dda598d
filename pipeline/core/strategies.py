"""Calls beyond Self-Refine's own, each a named strategy a user opts into.

With the defaults a record's loop makes the method's calls and nothing else: one generate,
then feedback and refine in turn. The one extra call on by default is ``repair``: a call
cut off at max_tokens is asked once more (with a repetition penalty), since an answer cut
off mid-artifact is a failed call, not a sample. The strategies, each off by default, each
a call kind of its own in the trace, each counted by ``refine estimate``:

``samples = N``
    Every answer (the first and each refinement) is drafted N times from the same
    messages, the later N - 1 at ``sample_temperature``; the draft the checks rank best
    (the method's own on a tie) is the one the loop goes on with. Costs N - 1 more answer
    calls per iteration. With ``--max-iters 0`` it is best-of-N sampling.
``restart``
    Where the checks found problems in the latest answer, one more draft of the next
    iteration is written afresh from the request and those findings, without the failing
    answer. Costs one answer call per refinement of an answer with findings.
``copy-retry``
    A refinement that hands back its input unchanged is asked once more at
    ``copy_temperature`` instead of ending the loop. Costs one answer call per copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..errors import ConfigError
from .steps import CallKind, Step

__all__ = ["NAMES", "Strategies", "next_draft", "parse_specs"]

NAMES = ("samples", "restart", "copy-retry")
DEFAULT_SAMPLE_TEMPERATURE = 1.0
DEFAULT_COPY_TEMPERATURE = 1.0
MAX_SAMPLES = 16


@dataclass(frozen=True, slots=True)
class Strategies:
    """Which extra calls a record's loop makes (all off by default but ``repair``)."""

    samples: int = 1  # drafts of each answer, the method's own included
    sample_temperature: float = DEFAULT_SAMPLE_TEMPERATURE
    restart: bool = False
    copy_retry: bool = False
    copy_temperature: float = DEFAULT_COPY_TEMPERATURE
    repair: bool = True  # ask a call cut off at max_tokens once more

    @property
    def names(self) -> tuple[str, ...]:
        """The strategies on, as the CLI names them (repair, on by default, is not one)."""
        on = (self.samples > 1, self.restart, self.copy_retry)
        return tuple(name for name, flag in zip(NAMES, on, strict=True) if flag)

    def temperature(self, call_kind: CallKind, default: float) -> float:
        """The sampling temperature of a call of ``call_kind`` (``default``: the job's)."""
        if call_kind is CallKind.SAMPLE:
            return self.sample_temperature
        if call_kind is CallKind.COPY_RETRY:
            return self.copy_temperature
        return default


def parse_specs(specs: Iterable[str], base: Strategies) -> Strategies:
    """``base`` with the CLI's ``--strategy`` specs applied: ``samples=N``, ``restart``,
    ``copy-retry``, each of them ``NAME=off`` to turn a job's default off."""
    out = base
    for spec in specs:
        name, _, value = spec.partition("=")
        name = name.strip().replace("_", "-")
        value = value.strip()
        off = value.lower() in ("off", "false", "no", "0")
        if name == "samples":
            out = replace(out, samples=1 if off else _count(value or "2"))
        elif name in ("restart", "copy-retry"):
            if value and not off and value.lower() not in ("on", "true", "yes", "1"):
                raise ConfigError(f"--strategy {spec!r}: {name} takes no value but on or off")
            field = "restart" if name == "restart" else "copy_retry"
            out = replace(out, **{field: not off})
        else:
            raise ConfigError(
                f"--strategy {spec!r}: unknown strategy (known: {', '.join(NAMES)}; "
                "samples takes a count, samples=3)"
            )
    return out


def _count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_SAMPLES:
        raise ConfigError(f"--strategy samples=N: N must be 1 to {MAX_SAMPLES} (got {value!r})")
    return n


def next_draft(
    strategies: Strategies, drafted: Sequence[Step], latest_found: Sequence[str] | None
) -> CallKind | None:
    """The call kind of the next draft of an iteration, or None when it has all it gets.

    ``drafted``: the iteration's answer calls so far (any call kind, asked again or not);
    ``latest_found``: the findings on the answer the iteration refines (None for the
    first answer).
    """
    samples = sum(s.call_kind is CallKind.SAMPLE for s in drafted)
    if 1 + samples < strategies.samples:
        return CallKind.SAMPLE
    restarted = any(s.call_kind is CallKind.RESTART for s in drafted)
    if strategies.restart and latest_found and not restarted:
        return CallKind.RESTART
    return None
