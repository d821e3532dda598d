"""The record of a model call: what a client is asked and returns, what the loop keeps, what a
record ends as.

Plain values shared by the client, the loop, the journal and the output files.
Every step has a ``role`` (the part of Self-Refine it plays: generate, feedback, refine) and
a call kind (``CallKind``, why the call was made: the method's own call, a repair of a call
cut off at max_tokens, or a call of an opt-in strategy; the trace's ``kind``), so a trace
tells the method's calls from the extra ones and ``refine estimate`` and the report can
count each.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal, Protocol

from .hooks import HookFailure
from .records import Record

__all__ = [
    "CACHE_WRITES",
    "LENGTH",
    "CallKind",
    "Completion",
    "ModelClient",
    "Outcome",
    "Request",
    "Role",
    "Step",
    "StepSink",
    "Superseded",
    "Try",
    "hook_errors_of",
    "usage_of",
]

Role = Literal["generate", "feedback", "refine"]

# The error type of a call cut off at max_tokens that was not asked again (repair off, or
# the repair itself cut off): the step stands, and the answer's checks say it was cut off.
LENGTH = "length"


class CallKind(enum.StrEnum):
    """Why a call was made."""

    ANSWER = "answer"  # the method's generate or refine call
    FEEDBACK = "feedback"  # the method's critic call
    REPAIR = "repair"  # a call cut off at max_tokens, asked once more (on by default)
    SAMPLE = "sample"  # strategy `samples`: another draft from the same messages
    RESTART = "restart"  # strategy `restart`: an answer written afresh from its findings
    COPY_RETRY = "copy_retry"  # strategy `copy-retry`: a copied refinement asked again, hotter

    @property
    def strategy(self) -> bool:
        """Whether calls of this call kind come from an opt-in strategy (not the method)."""
        return self in (CallKind.SAMPLE, CallKind.RESTART, CallKind.COPY_RETRY)


class Superseded(enum.StrEnum):
    """Error types of an attempt the loop asked again: no answer of its own."""

    CUT_OFF = "cut_off"  # cut off at max_tokens; a repair follows
    COPY = "copy"  # a refinement identical to its input; a copy retry follows


@dataclass(frozen=True, slots=True)
class Try:
    """One HTTP attempt of a call: its status (or failure category) and how long it took."""

    status: int | str  # the HTTP status, or "timeout", "connection", "bad_response", ...
    latency_s: float

    def to_json(self) -> list[Any]:
        """The compact trace form: ``[status, latency_s]``."""
        return [self.status, self.latency_s]

    @classmethod
    def from_json(cls, value: Sequence[Any]) -> Try:
        """Read the compact trace form back."""
        return cls(value[0], float(value[1]))


@dataclass(frozen=True, slots=True)
class Request:
    """One model call as the loop asks for it: what every client is given, and all of it.

    Nothing here is any provider's: how the schema is asked for, the prompt cache key's
    field, a service tier are the client's business. The messages are a tuple of read-only
    mappings, shared, never copied: a client that changes them (a schema spelled out in
    the prompt) sends a copy and returns it as ``Completion.messages``.
    """

    messages: tuple[Mapping[str, str], ...]
    _: KW_ONLY
    temperature: float
    max_tokens: int
    schema: Mapping[str, Any] | None = None  # the feedback's JSON schema: structured output
    frequency_penalty: float | None = None  # only on the repair of a cut-off call
    cache_key: str | None = None  # the record's id: its calls share a prompt prefix


@dataclass(frozen=True, slots=True)
class Completion:
    """What a client returns for one successful model call."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    attempts: int
    model: str  # the model that answered, as the run records it
    finish_reason: str | None = None
    messages: list[dict[str, str]] | None = None  # as sent, when the client changed them
    tries: tuple[Try, ...] = ()  # every attempt, when there was more than one
    cached_tokens: int = 0  # prompt tokens the provider served from its cache
    cache_write_tokens: int = 0  # prompt tokens written to the provider's cache (Anthropic's)
    cache_write_1h_tokens: int = 0  # of them, those written for an hour (not 5 minutes)
    batch_id: str | None = None  # the batch (of a provider's batch API) that carried the call
    service_tier: str | None = None  # the tier the provider says served the call


class ModelClient(Protocol):
    """Anything that answers chat messages (the OpenAI client, or a fake in tests)."""

    @property
    def model(self) -> str:
        """The model name this client calls (recorded on every step)."""
        ...

    async def complete(self, request: Request) -> Completion:
        """The answer to ``request``.

        Raises CallError when the call fails for good (its record fails; the error carries
        the call's trace data: attempts, tries, the messages as sent, the model) and a
        FatalCallError when the run must stop.
        """
        ...


@dataclass(frozen=True, slots=True)
class Step:
    """One model call, as traced and checkpointed (a call that failed for good has ``error``)."""

    role: Role
    iteration: int
    messages: list[dict[str, str]]
    response: str | None  # the raw text returned; None when the call failed for good
    parsed: dict[str, Any] | None
    usage: dict[str, int]
    latency_s: float
    attempts: int
    error: dict[str, Any] | None = None
    output: str | None = None  # the answer this step produced (generate/refine), after extraction
    metrics: dict[str, Any] | None = None  # the job's evaluator on that answer
    checks: list[str] | None = None  # the job's check findings on that answer ([] = passed)
    model: str | None = None  # the model that answered
    tries: tuple[Try, ...] = ()  # each attempt's status and latency, when there was more than one
    batch_id: str | None = None  # the Batch API batch that carried the call
    call_kind: CallKind | None = None  # None: the method's own (ANSWER; FEEDBACK for the critic)
    service_tier: str | None = None  # the tier that served the call, where the provider says
    hook_errors: tuple[HookFailure, ...] = ()  # the job's hooks that failed on this answer

    def __post_init__(self) -> None:
        if self.call_kind is None:
            default = CallKind.FEEDBACK if self.role == "feedback" else CallKind.ANSWER
            object.__setattr__(self, "call_kind", default)

    @property
    def failed(self) -> bool:
        """Whether this is a call that failed for good (it returned nothing)."""
        return self.response is None

    @property
    def superseded(self) -> bool:
        """Whether the loop asked this attempt again (cut off, or copied): no answer of its own."""
        return (self.error or {}).get("type") in (Superseded.CUT_OFF, Superseded.COPY)

    @property
    def is_draft(self) -> bool:
        """An answer that stands: generate or refine, not failed, not asked again."""
        return self.role != "feedback" and not self.failed and not self.superseded

    def to_dict(self, sent: Mapping[str, Any]) -> dict[str, Any]:
        """The trace/checkpoint shape, with ``sent`` standing for the messages (how a record's
        steps store them is ``core.trace``'s business)."""
        d: dict[str, Any] = {
            "role": self.role,
            "kind": str(self.call_kind),
            "model": self.model,
            "iteration": self.iteration,
            **sent,
            "response": self.response,
            "parsed": self.parsed,
            "usage": self.usage,
            "latency_s": self.latency_s,
            "attempts": self.attempts,
            "error": self.error,
        }
        optional = {
            "tries": [t.to_json() for t in self.tries] or None,
            "batch_id": self.batch_id,
            "service_tier": self.service_tier,
            "output": self.output,
            "metrics": self.metrics,
            "checks": self.checks,
            "hook_errors": [f.to_json() for f in self.hook_errors] or None,
        }
        d.update((k, v) for k, v in optional.items() if v is not None)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], messages: list[dict[str, str]]) -> Step:
        """Rebuild a step from its checkpoint shape and its ``messages`` as sent (rebuilt by
        ``core.trace``)."""
        raw = d.get("kind")  # the trace's key for the call kind
        call_kind = CallKind(raw) if isinstance(raw, str) and raw in set(CallKind) else None
        return cls(
            role=d["role"],
            iteration=int(d["iteration"]),
            messages=messages,
            response=d["response"],
            parsed=d.get("parsed"),
            usage=dict(d["usage"]),
            latency_s=float(d["latency_s"]),
            attempts=int(d["attempts"]),
            error=d.get("error"),
            output=d.get("output"),
            metrics=d.get("metrics"),
            checks=d.get("checks"),
            model=d.get("model"),
            tries=tuple(Try.from_json(t) for t in d.get("tries") or ()),
            batch_id=d.get("batch_id"),
            call_kind=call_kind,
            service_tier=d.get("service_tier"),
            hook_errors=tuple(HookFailure.from_json(f) for f in d.get("hook_errors") or ()),
        )


class StepSink(Protocol):
    """Where each completed step goes before the loop moves on (the journal)."""

    async def save(self, record_id: str, earlier: Sequence[Step], step: Step) -> None:
        """Keep ``step``, which follows ``earlier``, the record's steps before it (so its
        index is ``len(earlier)``; the loop appends to it once this returns); return once
        it is durable."""
        ...


def hook_errors_of(steps: Sequence[Step]) -> dict[str, int]:
    """How many answers each hook failed on, over steps (only hooks that failed)."""
    counts: dict[str, int] = {}
    for step in steps:
        for failure in step.hook_errors:
            counts[str(failure.hook)] = counts.get(str(failure.hook), 0) + 1
    return counts


# Usage keys present only where a provider reports them: tokens written to its cache.
CACHE_WRITES = ("cache_write_tokens", "cache_write_1h_tokens")


def usage_of(steps: Sequence[Step]) -> dict[str, int]:
    """Tokens and calls summed over steps (a call that failed for good is not a call made).

    Tokens written to a provider's cache (``CACHE_WRITES``) are summed where any were.
    """
    made = [s for s in steps if not s.failed]
    usage = {
        "prompt_tokens": sum(s.usage.get("prompt_tokens", 0) for s in made),
        "cached_tokens": sum(s.usage.get("cached_tokens", 0) for s in made),
        "completion_tokens": sum(s.usage.get("completion_tokens", 0) for s in made),
        "calls": len(made),
    }
    for key in CACHE_WRITES:
        written = sum(s.usage.get(key, 0) for s in made)
        if written:
            usage[key] = written
    return usage


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished record: the output line's content plus the steps for its trace."""

    record: Record
    status: Literal["done", "failed"]
    output: str | None
    iterations: int
    chosen_iteration: int | None
    stop_reason: str
    score: float | None
    steps: tuple[Step, ...]
    error: dict[str, Any] | None = None
    scores: tuple[float | None, ...] = field(default=())
    tests: str | None = None  # the chosen answer's own tests (answers that carry tests)
    chosen_step: int | None = None  # the chosen answer's index in ``steps``
    answer_steps: tuple[int, ...] = ()  # each iteration's answer, as an index in ``steps``
    chosen_by: str = "default"  # the selection rule that chose the output

    def usage(self) -> dict[str, int]:
        """Tokens and calls summed over the record's steps."""
        return usage_of(self.steps)

    def answers(self) -> list[Step]:
        """Each iteration's answer (the draft its loop went on with), in order."""
        return [self.steps[i] for i in self.answer_steps]

    def output_line(self, cost_usd: float | None = None) -> dict[str, Any]:
        """The outputs.jsonl object: DESIGN.md's fields, plus per-iteration scores and metrics."""
        metrics = [s.metrics for s in self.answers()]
        chosen = None if self.chosen_step is None else self.steps[self.chosen_step]
        line = {
            "id": self.record.id,
            "line": self.record.line,
            "status": self.status,
            "output": self.output,
            "iterations": self.iterations,
            "chosen_iteration": self.chosen_iteration,
            "stop_reason": self.stop_reason,
            "score": self.score,
            "scores": list(self.scores),
            "metrics": chosen.metrics if chosen is not None else None,
            "metrics_by_iteration": metrics if any(m is not None for m in metrics) else None,
            "usage": self.usage(),
            "cost_usd": cost_usd,
            "error": self.error,
        }
        hooks = hook_errors_of(self.steps)
        if hooks:
            line["hook_errors"] = hooks
        if self.tests is not None:
            line["tests"] = self.tests
        if self.chosen_by != "default":
            line["chosen_by"] = self.chosen_by
        if self.chosen_step is not None and self.chosen_step not in self.answer_steps:
            line["chosen_step"] = self.chosen_step  # a draft no iteration went on with
        return line
