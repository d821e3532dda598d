"""A job's hooks run on an answer, held to their contract.

``evaluate(fields, output)`` returns a mapping of metric names to JSON values (it may read
labels); ``check(fields, output)`` returns a list of findings, each a string (it never sees
a label). A hook that raises, or returns anything else (a string from ``check`` is not a
list of findings: its characters are not sent to the model), fails on that answer: the
failure is recorded on the step as a ``HookFailure`` naming the hook and the job, what it
would have given is left out (no metrics; no findings, so the answer passes), and the run
goes on. Counting failures, and stopping a run whose hook fails on every answer, is the
run's business (``pipeline.runs``). The loader checks what it can before any call: each
hook takes two arguments.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["Hook", "HookFailure", "Judged", "judge", "signature_problem"]


class Hook(enum.StrEnum):
    """The hooks a job's hooks file may define as functions."""

    EVALUATE = "evaluate"
    CHECK = "check"


@dataclass(frozen=True, slots=True)
class HookFailure:
    """A hook that raised, or returned what its contract does not allow, on one answer."""

    hook: Hook
    message: str

    def to_json(self) -> dict[str, str]:
        """The trace's form."""
        return {"hook": str(self.hook), "message": self.message}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HookFailure:
        """Read the trace's form."""
        return cls(Hook(data["hook"]), str(data["message"]))


@dataclass(frozen=True, slots=True)
class Judged:
    """What the hooks said of an answer: metrics, findings, and the hooks that failed."""

    metrics: dict[str, Any] | None = None
    findings: list[str] | None = None  # None: not checked
    failures: tuple[HookFailure, ...] = ()


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _metrics(job: str, value: object) -> dict[str, Any] | HookFailure:
    """The evaluator's answer as metrics, or why it breaks the contract."""
    where = f"hook evaluate of job {job!r}"
    if not isinstance(value, Mapping):
        return HookFailure(
            Hook.EVALUATE, f"{where} returned {_type_name(value)}, not a dict of metrics"
        )
    metrics = dict(value)
    bad = next((k for k in metrics if not isinstance(k, str)), None)
    if bad is not None:
        return HookFailure(Hook.EVALUATE, f"{where} returned a metric named {bad!r}, not a string")
    try:
        orjson.dumps(metrics)
    except TypeError as err:
        return HookFailure(Hook.EVALUATE, f"{where} returned a value that is not JSON ({err})")
    return metrics


def _findings(job: str, value: object) -> list[str] | HookFailure:
    """The check's answer as findings, or why it breaks the contract."""
    where = f"hook check of job {job!r}"
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        return HookFailure(
            Hook.CHECK,
            f"{where} returned {_type_name(value)}, not a list of findings (strings; [] "
            "when there are none)",
        )
    bad = next((f for f in value if not isinstance(f, str)), None)
    if bad is not None:
        return HookFailure(
            Hook.CHECK, f"{where} returned a finding of type {_type_name(bad)}, not a string"
        )
    return list(value)


def judge(
    job: str,
    evaluator: Callable[[Mapping[str, Any], str], object] | None,
    checker: Callable[[Mapping[str, Any], str], object] | None,
    fields: Mapping[str, Any],
    shown: Mapping[str, Any],
    output: str,
) -> Judged:
    """Run the evaluator on ``fields`` and the check on ``shown`` (the fields less labels)."""
    metrics: dict[str, Any] | None = None
    findings: list[str] | None = None
    failures: list[HookFailure] = []
    if evaluator is not None:
        try:  # the evaluator measures: it may read labels
            got = _metrics(job, evaluator(fields, output))
        except Exception as err:  # a broken evaluator is recorded, never a crash
            got = HookFailure(Hook.EVALUATE, _raised("evaluate", job, err))
        if isinstance(got, HookFailure):
            failures.append(got)
        else:
            metrics = got
    if checker is not None:
        try:  # checks steer the loop: they never see a label
            found = _findings(job, checker(shown, output))
        except Exception as err:  # a broken check is recorded, and passes
            found = HookFailure(Hook.CHECK, _raised("check", job, err))
        if isinstance(found, HookFailure):
            failures.append(found)
            findings = []
        else:
            findings = found
    return Judged(metrics, findings, tuple(failures))


def _raised(hook: str, job: str, err: Exception) -> str:
    return f"hook {hook} of job {job!r} raised {type(err).__name__}: {err}"


def signature_problem(hook: Callable[..., object]) -> str | None:
    """Why ``hook`` cannot be called as ``hook(fields, output)``, or None when it can."""
    try:
        sig = inspect.signature(hook)
    except (TypeError, ValueError):
        return None  # no signature to read (a builtin): the first call will tell
    try:
        sig.bind(object(), "")
    except TypeError:
        return f"must take two arguments (fields, output); it takes {sig}"
    return None
