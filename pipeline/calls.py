"""The record of a model call: what a client returns, what the loop keeps, what a record ends as.

These are plain values shared by the client, the loop, the checkpoint store and the
output files; this module imports nothing else of the package but the record type, so each
of those can use the types without depending on the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .answers import FAILED_TESTS
from .records import Record

__all__ = [
    "Completion",
    "ModelClient",
    "Outcome",
    "Role",
    "Step",
    "StepSink",
    "Try",
    "is_answer",
    "is_copy",
    "is_cut_retry",
    "is_draft",
    "is_redraft",
    "is_retried",
    "usage_of",
]

Role = Literal["generate", "feedback", "refine"]


@dataclass(frozen=True, slots=True)
class Try:
    """One HTTP attempt of a call: its status (or failure kind) and how long it took."""

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
class Completion:
    """What a client returns for one successful model call."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    attempts: int
    finish_reason: str | None = None
    messages: list[dict[str, str]] | None = None  # as sent, when the client changed them
    model: str | None = None  # the model that answered (set by the client)
    tries: tuple[Try, ...] = ()  # every attempt, when there was more than one
    cached_tokens: int = 0  # prompt tokens the provider served from its cache
    batch_id: str | None = None  # the Batch API batch that carried the call


class ModelClient(Protocol):
    """Anything that answers chat messages (the OpenAI client, or a fake in tests)."""

    @property
    def model(self) -> str:
        """The model name this client calls (recorded on every step)."""
        ...

    async def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        schema: Mapping[str, Any] | None,
        temperature: float,
        max_tokens: int,
        frequency_penalty: float | None = None,
    ) -> Completion: ...


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
    findings: list[dict[str, str]] | None = None  # feedback as the refine step sees it, by source
    model: str | None = (
        None  # the model that answered (None in journals written before it was kept)
    )
    tries: tuple[Try, ...] = ()  # each attempt's status and latency, when there was more than one
    batch_id: str | None = None  # the Batch API batch that carried the call

    @property
    def failed(self) -> bool:
        """Whether this is a call that failed for good (it returned nothing)."""
        return self.response is None

    def to_dict(self) -> dict[str, Any]:
        """The trace/checkpoint shape."""
        d: dict[str, Any] = {
            "role": self.role,
            "model": self.model,
            "iteration": self.iteration,
            "messages": self.messages,
            "response": self.response,
            "parsed": self.parsed,
            "usage": self.usage,
            "latency_s": self.latency_s,
            "attempts": self.attempts,
            "error": self.error,
        }
        if self.tries:
            d["tries"] = [t.to_json() for t in self.tries]
        if self.batch_id is not None:
            d["batch_id"] = self.batch_id
        if self.output is not None:
            d["output"] = self.output
        if self.metrics is not None:
            d["metrics"] = self.metrics
        if self.checks is not None:
            d["checks"] = self.checks
        if self.findings is not None:
            d["findings"] = self.findings
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Step:
        """Rebuild a step from its checkpoint shape."""
        return cls(
            role=d["role"],
            iteration=int(d["iteration"]),
            messages=list(d["messages"]),
            response=d["response"],
            parsed=d.get("parsed"),
            usage=dict(d["usage"]),
            latency_s=float(d["latency_s"]),
            attempts=int(d["attempts"]),
            error=d.get("error"),
            output=d.get("output"),
            metrics=d.get("metrics"),
            checks=d.get("checks"),
            findings=d.get("findings"),
            model=d.get("model"),
            tries=tuple(Try.from_json(t) for t in d.get("tries") or ()),
            batch_id=d.get("batch_id"),
        )


class StepSink(Protocol):
    """Where each completed step goes before the loop moves on (the checkpoint store)."""

    async def save(self, record_id: str, index: int, step: Step) -> None: ...


def usage_of(steps: Sequence[Step]) -> dict[str, int]:
    """Tokens and calls summed over steps (a call that failed for good is not a call made)."""
    made = [s for s in steps if not s.failed]
    return {
        "prompt_tokens": sum(s.usage.get("prompt_tokens", 0) for s in made),
        "completion_tokens": sum(s.usage.get("completion_tokens", 0) for s in made),
        "calls": len(made),
    }


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
    tests: str | None = None  # the chosen answer's own tests (code-with-tests jobs)
    chosen_step: int | None = None  # the chosen answer's index in ``steps``

    def usage(self) -> dict[str, int]:
        """Tokens and calls summed over the record's steps."""
        return usage_of(self.steps)

    def answers(self) -> list[Step]:
        """Answer steps that are iterations: not feedback, failed calls or retried attempts."""
        return [s for s in self.steps if is_answer(s)]

    def output_line(self, cost_usd: float | None = None) -> dict[str, Any]:
        """The outputs.jsonl object: DESIGN.md's fields, plus per-iteration scores and metrics."""
        answers = self.answers()
        metrics = [s.metrics for s in answers]
        if self.chosen_step is not None:
            chosen: Step | None = self.steps[self.chosen_step]
        else:
            chosen = next((s for s in answers if s.iteration == self.chosen_iteration), None)
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
        if self.tests is not None:
            line["tests"] = self.tests
        if chosen is not None and not is_answer(chosen):
            # a first draft or a cut-off attempt, not the iteration's answer
            line["chosen_step"] = self.chosen_step
        return line

    def trace_line(self) -> dict[str, Any]:
        """The traces.jsonl object."""
        return {"id": self.record.id, "steps": [s.to_dict() for s in self.steps]}


COPY = "copy"  # error type of a refinement that copied its input and was retried


def is_copy(step: Step) -> bool:
    """A refinement identical to its input that the copy guard retried (not an iteration)."""
    return step.error is not None and step.error.get("type") == COPY


# Error type of an answer cut off at max_tokens inside its artifact, asked once more
CUT_RETRY = "cut_off"


def is_cut_retry(step: Step) -> bool:
    """An answer cut off at max_tokens that was asked once more (not an iteration)."""
    return step.error is not None and step.error.get("type") == CUT_RETRY


# Error type of a refinement its checks still found problems in, drafted once more from
# the same messages; it stays a candidate for the chosen answer (see ``is_draft``)
REDRAFT = "redraft"


def is_redraft(step: Step) -> bool:
    """A refinement drafted once more because its checks found problems (not an iteration,
    but a candidate: both drafts run the pooled tests and either may be chosen)."""
    return step.error is not None and step.error.get("type") == REDRAFT


def is_retried(step: Step) -> bool:
    """An answer attempt the loop asked again: a copy, a cut-off answer or a redraft."""
    return is_copy(step) or is_cut_retry(step) or is_redraft(step)


def is_answer(step: Step) -> bool:
    """A generate or refine step that counts as an iteration's answer."""
    return step.role != "feedback" and not is_retried(step) and not step.failed


def is_draft(step: Step) -> bool:
    """A step whose answer may be chosen: an iteration's answer, a refinement drafted
    once more (``is_redraft``), or an answer cut off at max_tokens and asked again whose
    tests ran (code that carries its tests: the code is whole, the test the limit stopped
    is dropped; its checks say it was cut off, and the pooled tests judge it with the
    rest). A cut-off answer of another job is prose stopped mid-sentence, never chosen."""
    if is_cut_retry(step):
        return step.role != "feedback" and FAILED_TESTS in (step.metrics or {})
    return is_answer(step) or is_redraft(step)
