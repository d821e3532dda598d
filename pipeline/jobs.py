"""Jobs: the data the loop reads (prompts, feedback schema, stop rule, hooks).

A job is a TOML file::

    name = "code-improve"
    description = "..."

    [input.task]                # one table per input field
    type = "string"             # string | string-list | number | integer | boolean | any
    description = "a coding request"
    required = true             # default
    join = ", "                 # default: how a list of strings is rendered in prompts

    [prompts]                   # {{name}} placeholders: input fields, output, feedback,
                                # history, findings (the checks' findings alone, else the
                                # critic's actions; "- " lines). The feedback prompt may
                                # use output and findings (there: what the checks found in
                                # the answer, before any critic; "(none)" when they found
                                # nothing, "(not checked)" when checks are off)
    system = "..."              # optional
    generate = "..."
    feedback = "..."
    refine = "..."              # must use {{history}}: the earlier (output, feedback) pairs
    refine_copy = "..."         # optional: the copy guard's retry (see retry_copy below)
    refine_failing = "..."      # optional: asked instead of refine where the checks found
                                # problems in the answer being refined (same placeholders)

    [feedback]
    schema = { ... }            # JSON Schema of the feedback object (TOML table or JSON string)
    actions_field = "actions"   # list of concrete actions (required in the schema)
    done_field = "done"         # boolean
    score_field = "score"       # optional: numeric score; enables best-scored choice
    score_from = ["a", "b"]     # optional: the score is the sum of these rating fields
                                # (small critics add up their own ratings wrongly)

    [stop]
    max_iters = 3               # default for --max-iters
    score_threshold = 9         # optional: stop once score >= this

    [model]
    temperature = 0.7
    max_tokens = 1024

    [output]
    extract = "text"            # the answer less preamble, label and wrapping quotes; or
                                # "code": its first fenced Python block; or "code-with-tests":
                                # its code and the tests it carries (see pipeline/answers.py)

    [hooks]
    file = "hooks.py"           # optional, relative to the job file; may define
                                # evaluate(fields, output) -> dict of metrics, and
                                # check(fields, output) -> list of findings: problems a
                                # program verified, merged into the feedback the refine
                                # step sees; while any remain, the critic's done is vetoed
                                # rewrite(findings) -> bool: whether the findings on an
                                # answer call for [prompts] refine_failing (without it,
                                # any finding does); False: the answer is edited instead

    [stop] also takes retry_copy = true: a refinement identical to its input is tried
    once more at copy_temperature (default 1.0) before the loop stops with no_change (with
    extract = "code-with-tests", also the same code while its checks still fail); with
    [prompts] refine_copy (same placeholders as refine) that retry asks it instead, for
    example without the answer it copied. [stop] redraft = true: a refinement its checks
    still find problems in is drafted once more from the same messages (at the job's
    temperature, or at redraft_temperature where set); redraft = N drafts it again while
    its checks still find problems, at most N more times (true is 1), less any copy or
    cut-off answer of that iteration already asked again; every draft runs the tests
    pooled for the choice and any may be the chosen answer, the last is the iteration's
    answer the critic sees. [prompts]
    refine_failing is asked instead of refine where the checks found problems in the
    answer being refined: for example a fresh start from those findings, without the
    code that failed them or the critic's actions. A rewrite hook may say which findings
    do not call for it (the answer is then edited with refine).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

from .answers import EXTRACT_MODES
from .errors import JobError

__all__ = ["FIELD_TYPES", "InputField", "Job", "builtin_jobs", "load_job", "render"]

FIELD_TYPES = ("string", "string-list", "number", "integer", "boolean", "any")
LOOP_VARIABLES = ("output", "feedback", "history", "findings")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_TOP_KEYS = (
    "description",
    "feedback",
    "hooks",
    "input",
    "model",
    "name",
    "output",
    "prompts",
    "stop",
)
_TABLE_KEYS = {
    "prompts": ("feedback", "generate", "refine", "refine_copy", "refine_failing", "system"),
    "feedback": ("actions_field", "done_field", "schema", "score_field", "score_from"),
    "stop": (
        "copy_temperature",
        "max_iters",
        "redraft",
        "redraft_temperature",
        "retry_copy",
        "score_threshold",
    ),
    "model": ("max_tokens", "temperature"),
    "output": ("extract",),
    "hooks": ("file",),
}
_FIELD_KEYS = ("description", "join", "required", "type")
_JOBS_DIR = Path(__file__).resolve().parent.parent / "jobs"

Evaluator = Callable[[Mapping[str, Any], str], Mapping[str, Any]]
Checker = Callable[[Mapping[str, Any], str], Sequence[str]]
Rewriter = Callable[[Sequence[str]], bool]


@dataclass(frozen=True, slots=True)
class InputField:
    """One input field a record must (or may) carry."""

    name: str
    type: str
    required: bool = True
    description: str = ""
    join: str = ", "  # how a list of strings is rendered into prompts

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
    extract: str
    evaluator: Evaluator | None = field(default=None, compare=False)
    checker: Checker | None = field(default=None, compare=False)
    # whether check findings call for failing_prompt (None: any finding does)
    rewriter: Rewriter | None = field(default=None, compare=False)
    retry_copy: bool = False
    copy_temperature: float = 1.0
    copy_prompt: str | None = None  # the copy guard's retry asks this instead of refine
    # a refinement its checks find problems in is drafted again, at most this many times
    redraft: int = 0
    redraft_temperature: float | None = None  # the later drafts'; None: the job's temperature
    # asked instead of refine_prompt where the checks found problems in the answer refined
    failing_prompt: str | None = None
    score_from: tuple[str, ...] = ()  # rating fields whose sum replaces the critic's own score

    @property
    def scored(self) -> bool:
        """Whether feedback carries a numeric score (best-scored choice applies)."""
        return self.score_field is not None


def render(template: str, values: Mapping[str, str]) -> str:
    """Fill ``{{name}}`` placeholders; every name must be in ``values``."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def builtin_jobs() -> dict[str, Path]:
    """Built-in job names and their files."""
    return {p.stem: p for p in sorted(_JOBS_DIR.glob("*.toml"))}


def load_job(name_or_path: str) -> Job:
    """Load a built-in job by name, or a job file by path."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" or path.exists()):
        builtins = builtin_jobs()
        if name_or_path not in builtins:
            known = ", ".join(builtins) or "none"
            raise JobError(name_or_path, "job", f"no such built-in job or file (built-in: {known})")
        path = builtins[name_or_path]
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise JobError(str(path), "file", f"cannot read: {err.strerror}") from err
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise JobError(str(path), "toml", str(err)) from err
    return _parse(data, path, raw)


class _Reader:
    """Typed access to a TOML document that names the offending key on error."""

    __slots__ = ("data", "source")

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data = data
        self.source = source

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                if default is ...:
                    raise JobError(self.source, key, "missing")
                return default
            node = node[part]
        if isinstance(node, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise JobError(self.source, key, f"expected {_kind_name(kind)}, got bool")
        if not isinstance(node, kind):
            raise JobError(
                self.source, key, f"expected {_kind_name(kind)}, got {type(node).__name__}"
            )
        return node


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _parse(data: Mapping[str, Any], path: Path, raw: bytes) -> Job:
    src = str(path)
    r = _Reader(data, src)
    for key in data:
        if key not in _TOP_KEYS:
            raise JobError(src, key, f"unknown key (expected one of {', '.join(_TOP_KEYS)})")
    for table, known in _TABLE_KEYS.items():
        for key in r.get(table, dict, {}):
            if key not in known:
                raise JobError(
                    src, f"{table}.{key}", f"unknown key (expected one of {', '.join(known)})"
                )
    for fname, spec in r.get("input", dict, {}).items():
        for key in spec if isinstance(spec, dict) else ():
            if key not in _FIELD_KEYS:
                raise JobError(
                    src,
                    f"input.{fname}.{key}",
                    f"unknown key (expected one of {', '.join(_FIELD_KEYS)})",
                )

    name = r.get("name", str)
    inputs = _parse_inputs(r)
    input_names = {f.name for f in inputs}
    clash = input_names & set(LOOP_VARIABLES)
    if clash:
        raise JobError(src, f"input.{sorted(clash)[0]}", "name is reserved for the loop")

    prompts = {}
    roles = (("generate", ()), ("feedback", ("output", "findings")), ("refine", LOOP_VARIABLES))
    for role, extra in roles:
        text = r.get(f"prompts.{role}", str)
        _check_placeholders(src, f"prompts.{role}", text, input_names | set(extra))
        prompts[role] = text
    if not _PLACEHOLDER.search(prompts["refine"]) or "history" not in _placeholders(
        prompts["refine"]
    ):
        raise JobError(src, "prompts.refine", "must use {{history}} (earlier outputs and feedback)")
    system = r.get("prompts.system", str, None)
    if system is not None:
        _check_placeholders(src, "prompts.system", system, input_names)

    schema_raw = r.get("feedback.schema", (dict, str))
    if isinstance(schema_raw, str):
        try:
            schema_raw = orjson.loads(schema_raw)
        except orjson.JSONDecodeError as err:
            raise JobError(src, "feedback.schema", f"invalid JSON: {err}") from err
    if not isinstance(schema_raw, dict):
        raise JobError(src, "feedback.schema", "must be an object schema with properties")
    schema: dict[str, Any] = schema_raw
    if schema.get("type") != "object" or not isinstance(schema.get("properties"), dict):
        raise JobError(src, "feedback.schema", "must be an object schema with properties")
    props: dict[str, Any] = schema["properties"]
    actions_field = r.get("feedback.actions_field", str, "actions")
    done_field = r.get("feedback.done_field", str, "done")
    score_field = r.get("feedback.score_field", str, None)
    for key, fname, want in (
        ("feedback.actions_field", actions_field, "array"),
        ("feedback.done_field", done_field, "boolean"),
        ("feedback.score_field", score_field, "number"),
    ):
        if fname is None:
            continue
        if fname not in props:
            raise JobError(src, key, f"{fname!r} is not a property of feedback.schema")
        prop = props[fname]
        if not isinstance(prop, dict):
            raise JobError(src, key, f"property {fname!r} must be a table")
        got = prop.get("type")
        if want == "number" and got in ("number", "integer"):
            continue
        if got != want:
            raise JobError(src, key, f"property {fname!r} must have type {want!r}")

    score_from = tuple(r.get("feedback.score_from", list, []))
    for i, fname in enumerate(score_from):
        if not isinstance(fname, str) or fname not in props:
            raise JobError(src, f"feedback.score_from[{i}]", f"{fname!r} is not a property")
    if score_from and score_field is None:
        raise JobError(src, "feedback.score_from", "needs feedback.score_field")

    max_iters = r.get("stop.max_iters", int, 3)
    if max_iters < 0:
        raise JobError(src, "stop.max_iters", "must be >= 0")
    threshold = r.get("stop.score_threshold", (int, float), None)
    if threshold is not None and score_field is None:
        raise JobError(src, "stop.score_threshold", "needs feedback.score_field")
    temperature = float(r.get("model.temperature", (int, float), 0.7))
    max_tokens = r.get("model.max_tokens", int, 1024)
    if max_tokens <= 0:
        raise JobError(src, "model.max_tokens", "must be > 0")
    extract = r.get("output.extract", str, "text")
    if extract not in EXTRACT_MODES:
        raise JobError(src, "output.extract", f"must be one of {', '.join(EXTRACT_MODES)}")

    retry_copy = r.get("stop.retry_copy", bool, False)
    copy_temperature = float(r.get("stop.copy_temperature", (int, float), 1.0))
    copy_prompt = r.get("prompts.refine_copy", str, None)
    redraft = int(r.get("stop.redraft", (bool, int), False))  # true: once
    if redraft < 0:
        raise JobError(src, "stop.redraft", "must be true, false or a count >= 0")
    if copy_prompt is not None:
        _check_placeholders(
            src, "prompts.refine_copy", copy_prompt, input_names | set(LOOP_VARIABLES)
        )
        if not retry_copy:
            raise JobError(src, "prompts.refine_copy", "needs [stop] retry_copy = true")
    failing_prompt = r.get("prompts.refine_failing", str, None)
    if failing_prompt is not None:
        _check_placeholders(
            src, "prompts.refine_failing", failing_prompt, input_names | set(LOOP_VARIABLES)
        )
    redraft_temperature = r.get("stop.redraft_temperature", (int, float), None)
    if redraft_temperature is not None and not redraft:
        raise JobError(src, "stop.redraft_temperature", "needs [stop] redraft = true (or a count)")

    digest = hashlib.sha256(raw)
    hooks: dict[str, Any] = {"evaluate": None, "check": None, "rewrite": None}
    hooks_file = r.get("hooks.file", str, None)
    if hooks_file is not None:
        hooks_path = (path.parent / hooks_file).resolve()
        module = _load_hooks(src, hooks_path)
        digest.update(hooks_path.read_bytes())
        for hook in hooks:
            hooks[hook] = getattr(module, hook, None)
            if hooks[hook] is not None and not callable(hooks[hook]):
                raise JobError(src, "hooks.file", f"{hook} must be a function")

    return Job(
        name=name,
        description=r.get("description", str, ""),
        source=src,
        content_hash=digest.hexdigest(),
        inputs=inputs,
        system_prompt=system,
        generate_prompt=prompts["generate"],
        feedback_prompt=prompts["feedback"],
        refine_prompt=prompts["refine"],
        feedback_schema=schema,
        actions_field=actions_field,
        done_field=done_field,
        score_field=score_field,
        max_iters=max_iters,
        score_threshold=float(threshold) if threshold is not None else None,
        temperature=temperature,
        max_tokens=max_tokens,
        extract=extract,
        evaluator=hooks["evaluate"],
        checker=hooks["check"],
        rewriter=hooks["rewrite"],
        retry_copy=retry_copy,
        copy_temperature=copy_temperature,
        copy_prompt=copy_prompt,
        redraft=redraft,
        failing_prompt=failing_prompt,
        redraft_temperature=float(redraft_temperature) if redraft_temperature is not None else None,
        score_from=score_from,
    )


def _parse_inputs(r: _Reader) -> tuple[InputField, ...]:
    table = r.get("input", dict)
    if not table:
        raise JobError(r.source, "input", "a job needs at least one input field")
    fields = []
    for fname, spec in table.items():
        key = f"input.{fname}"
        if not isinstance(spec, dict):
            raise JobError(r.source, key, "expected a table")
        ftype = spec.get("type", "string")
        if ftype not in FIELD_TYPES:
            raise JobError(r.source, f"{key}.type", f"must be one of {', '.join(FIELD_TYPES)}")
        required = spec.get("required", True)
        if not isinstance(required, bool):
            raise JobError(r.source, f"{key}.required", "expected bool")
        join = spec.get("join", ", ")
        if not isinstance(join, str):
            raise JobError(r.source, f"{key}.join", "expected a string")
        fields.append(InputField(fname, ftype, required, str(spec.get("description", "")), join))
    return tuple(fields)


def _placeholders(text: str) -> set[str]:
    return {m.group(1) for m in _PLACEHOLDER.finditer(text)}


def _check_placeholders(src: str, key: str, text: str, allowed: set[str]) -> None:
    unknown = sorted(_placeholders(text) - allowed)
    if unknown:
        raise JobError(
            src,
            key,
            f"unknown placeholder {{{{{unknown[0]}}}}} (known: {', '.join(sorted(allowed))})",
        )


def _load_hooks(src: str, path: Path) -> ModuleType:
    if not path.is_file():
        raise JobError(src, "hooks.file", f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"refine_job_hooks_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise JobError(src, "hooks.file", f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # a broken hook file is the job's error, not ours
        raise JobError(src, "hooks.file", f"{type(err).__name__}: {err}") from err
    return module
