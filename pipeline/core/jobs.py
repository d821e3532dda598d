"""The job spec: the data the loop reads (prompts, feedback schema, stop rule, answer kind, hooks).

A job is written as a TOML file and read by ``pipeline.core.loader``; see docs/jobs.md for
the format. Here are the loaded values and the few pure functions over them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .answer_kinds import AnswerKind, Text
from .metrics import MetricSpec
from .strategies import Strategies

__all__ = [
    "FIELD_TYPES",
    "FIELD_USES",
    "Checker",
    "Evaluator",
    "InputField",
    "Job",
    "builtin_jobs",
    "placeholders",
    "render",
]

FIELD_TYPES = ("string", "string-list", "number", "integer", "boolean", "any")
# How a field is used: shown to the model (every prompt of the record carries it), read by
# the job's checks only (test data, say), or a label: a reference answer that measures
# (the evaluator reads it) and never chooses (no prompt, check or selection rule sees it).
FIELD_USES = ("prompt", "check", "label")
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_JOBS_DIR = Path(__file__).resolve().parents[2] / "jobs"

Evaluator = Callable[[Mapping[str, Any], str], Mapping[str, Any]]
Checker = Callable[[Mapping[str, Any], str], Sequence[str]]
FieldUse = Literal["prompt", "check", "label"]


@dataclass(frozen=True, slots=True)
class InputField:
    """One input field a record must (or may) carry."""

    name: str
    type: str
    required: bool = True
    description: str = ""
    join: str = ", "  # how a list of strings is rendered into prompts
    use: FieldUse = "prompt"

    def check(self, value: Any) -> str | None:
        """Why ``value`` does not fit this field, or None when it does."""
        ok = {
            "string": isinstance(value, str),
            "string-list": isinstance(value, list) and all(isinstance(v, str) for v in value),
            "number": isinstance(value, int | float) and not isinstance(value, bool),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "boolean": isinstance(value, bool),
            "any": True,
        }[self.type]
        if ok:
            return None
        return f"expected {self.type}, got {type(value).__name__}"


@dataclass(frozen=True, slots=True)
class Job:
    """A loaded, validated job definition."""

    name: str
    description: str
    source: str
    content_hash: str
    inputs: tuple[InputField, ...]
    system_prompt: str | None
    generate_prompt: str
    feedback_prompt: str
    refine_prompt: str
    feedback_schema: Mapping[str, Any]
    actions_field: str
    done_field: str
    score_field: str | None
    max_iters: int
    score_threshold: float | None
    temperature: float
    max_tokens: int
    answer_kind: AnswerKind = field(default_factory=Text, compare=False)  # TOML: output.kind
    select: str = "default"  # the rule choosing the output: "default", or its answer kind's
    strategies: Strategies = field(default_factory=Strategies)
    restart_prompt: str | None = None  # strategy restart's instruction (None: the built-in one)
    evaluator: Evaluator | None = field(default=None, compare=False)
    checker: Checker | None = field(default=None, compare=False)
    score_from: tuple[str, ...] = ()  # rating fields whose sum replaces the critic's own score
    # the evaluator's metrics as the hooks declare them (METRICS): better direction, source
    metrics: Mapping[str, MetricSpec] = field(default_factory=dict, compare=False)
    # the hooks (or the answer kind) run model-written programs (RUNS_PROGRAMS): a run probes the
    # sandbox first and, in strict mode, stops where the kernel cannot isolate them
    runs_programs: bool = False

    @property
    def scored(self) -> bool:
        """Whether feedback carries a numeric score (best-scored choice applies)."""
        return self.score_field is not None

    def shown_fields(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The fields a check or a selection rule may read: all but the labels."""
        labels = {f.name for f in self.inputs if f.use == "label"}
        return {k: v for k, v in fields.items() if k not in labels}


def render(template: str, values: Mapping[str, str]) -> str:
    """Fill ``{{name}}`` placeholders; every name must be in ``values``."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def placeholders(text: str) -> set[str]:
    """The ``{{name}}`` placeholders a template uses."""
    return {m.group(1) for m in PLACEHOLDER.finditer(text)}


def builtin_jobs() -> dict[str, Path]:
    """Built-in job names and their files."""
    return {p.stem: p for p in sorted(_JOBS_DIR.glob("*.toml"))}
