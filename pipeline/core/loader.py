"""Reading a job file (TOML) into a ``Job``, refusing what would break the method.

Every error names the file and the key. The loader enforces Self-Refine's invariant: a
record's calls form one conversation (``pipeline.core.prompts``), so every refine call
carries the record's input, the latest answer, its feedback and every earlier pair; a job
file can only break that by leaving an input field out of the generate prompt that opens
the conversation, or by asking for placeholders of a layout where the prompts carried
those themselves, and it is refused for either. Labels never reach a prompt.
"""

from __future__ import annotations

import hashlib
import importlib.util
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

from ..errors import JobError
from .answer_kinds import BUILTIN_ANSWER_KINDS, AnswerKind
from .hooks import signature_problem
from .jobs import FIELD_TYPES, FIELD_USES, InputField, Job, builtin_jobs
from .jobs import placeholders as _placeholders
from .metrics import MetricSpec
from .strategies import MAX_SAMPLES, Strategies

__all__ = ["load_job"]

_KEYS: Mapping[str, tuple[str, ...]] = {
    "": ("description", "feedback", "hooks", "input", "model", "name", "output", "prompts",
         "stop", "strategies"),
    "prompts": ("feedback", "generate", "refine", "restart", "system"),
    "feedback": ("actions_field", "done_field", "schema", "score_field", "score_from"),
    "stop": ("max_iters", "score_threshold"),
    "model": ("max_tokens", "temperature"),
    "output": ("kind", "select"),
    "hooks": ("file",),
    "strategies": ("copy_retry", "copy_temperature", "repair", "restart", "sample_temperature",
                   "samples"),
}  # fmt: skip
_FIELD_KEYS = ("description", "join", "required", "type", "use")
# Placeholders of the old template layout, where each prompt carried the loop's state.
_CARRIED = {
    "output": "the latest answer",
    "feedback": "the feedback on it",
    "history": "the earlier answers and their feedback",
}


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
    return parse_job(data, path, raw)


class _Reader:
    """Typed access to a TOML document that names the offending key on error."""

    __slots__ = ("data", "source")

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data = data
        self.source = source

    def get(self, key: str, expected: type | tuple[type, ...], default: Any = ...) -> Any:
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                if default is ...:
                    raise JobError(self.source, key, "missing")
                return default
            node = node[part]
        types = expected if isinstance(expected, tuple) else (expected,)
        if (isinstance(node, bool) and bool not in types) or not isinstance(node, expected):
            names = " or ".join(k.__name__ for k in types)
            raise JobError(self.source, key, f"expected {names}, got {type(node).__name__}")
        return node

    def fail(self, key: str, why: str) -> JobError:
        return JobError(self.source, key, why)


def parse_job(data: Mapping[str, Any], path: Path, raw: bytes) -> Job:
    """A ``Job`` from a parsed TOML document (``raw``: the file's bytes, for its hash)."""
    r = _Reader(data, str(path))
    _check_keys(r)
    inputs = _inputs(r)
    prompts = _prompts(r, inputs)
    schema, fields = _feedback(r)
    module, digest = _hooks(r, path, raw)
    answer_kind, select = _output(r, module)
    max_iters = r.get("stop.max_iters", int, 3)
    if max_iters < 0:
        raise r.fail("stop.max_iters", "must be >= 0")
    threshold = r.get("stop.score_threshold", (int, float), None)
    if threshold is not None and fields["score_field"] is None:
        raise r.fail("stop.score_threshold", "needs feedback.score_field")
    max_tokens = r.get("model.max_tokens", int, 1024)
    if max_tokens <= 0:
        raise r.fail("model.max_tokens", "must be > 0")
    return Job(
        name=r.get("name", str),
        description=r.get("description", str, ""),
        source=r.source,
        content_hash=digest,
        inputs=inputs,
        system_prompt=prompts.get("system"),
        generate_prompt=prompts["generate"],
        feedback_prompt=prompts["feedback"],
        refine_prompt=prompts["refine"],
        restart_prompt=prompts.get("restart"),
        feedback_schema=schema,
        max_iters=max_iters,
        score_threshold=None if threshold is None else float(threshold),
        temperature=float(r.get("model.temperature", (int, float), 0.7)),
        max_tokens=max_tokens,
        answer_kind=answer_kind,
        select=select,
        strategies=_strategies(r),
        evaluator=_hook(r, module, "evaluate"),
        checker=_hook(r, module, "check"),
        metrics=_metrics(r, module),
        runs_programs=_runs_programs(r, module),
        **fields,
    )


def _check_keys(r: _Reader) -> None:
    for table, known in _KEYS.items():
        node = r.data if not table else r.get(table, dict, {})
        for key in node:
            if key not in known:
                where = f"{table}.{key}" if table else key
                raise r.fail(where, f"unknown key (expected one of {', '.join(known)})")
    for name, spec in r.get("input", dict, {}).items():
        for key in spec if isinstance(spec, dict) else ():
            if key not in _FIELD_KEYS:
                raise r.fail(
                    f"input.{name}.{key}", f"unknown key (expected one of {', '.join(_FIELD_KEYS)})"
                )


def _inputs(r: _Reader) -> tuple[InputField, ...]:
    table = r.get("input", dict)
    if not table:
        raise r.fail("input", "a job needs at least one input field")
    fields = []
    for name, spec in table.items():
        key = f"input.{name}"
        if not isinstance(spec, dict):
            raise r.fail(key, "expected a table")
        type_ = r.get(f"{key}.type", str, "string")
        if type_ not in FIELD_TYPES:
            raise r.fail(f"{key}.type", f"must be one of {', '.join(FIELD_TYPES)}")
        use = r.get(f"{key}.use", str, "prompt")
        if use not in FIELD_USES:
            raise r.fail(f"{key}.use", f"must be one of {', '.join(FIELD_USES)}")
        if name in ("findings", *_CARRIED):
            raise r.fail(key, "name is reserved for the loop")
        fields.append(
            InputField(
                name,
                type_,
                r.get(f"{key}.required", bool, True),
                str(spec.get("description", "")),
                r.get(f"{key}.join", str, ", "),
                use,
            )
        )
    return tuple(fields)


def _prompts(r: _Reader, inputs: tuple[InputField, ...]) -> dict[str, str]:
    """The prompts, each using only the placeholders its place in the conversation allows."""
    shown = {f.name for f in inputs if f.use == "prompt"}
    hidden = {f.name: f.use for f in inputs if f.use != "prompt"}
    allowed = {
        "system": set(),
        "generate": shown,
        "feedback": shown | {"findings"},
        "refine": shown,
        "restart": shown | {"findings"},
    }
    prompts: dict[str, str] = {}
    for role, names in allowed.items():
        required = role in ("generate", "feedback", "refine")
        text = r.get(f"prompts.{role}", str, ... if required else None)
        if text is None:
            continue
        key = f"prompts.{role}"
        for name in sorted(_placeholders(text) - names):
            raise r.fail(key, _misplaced(role, name, hidden, names))
        prompts[role] = text
    missing = sorted(shown - _placeholders(prompts["generate"]))
    if missing:
        raise r.fail(
            "prompts.generate",
            f"must use {{{{{missing[0]}}}}}: the generate prompt opens every call's "
            "conversation, so each input field shown to the model goes there (mark test data "
            'use = "check" and reference answers use = "label")',
        )
    return prompts


def _misplaced(role: str, name: str, hidden: Mapping[str, str], names: set[str]) -> str:
    """Why placeholder ``name`` may not appear in the ``role`` prompt."""
    if name in hidden:
        what = "a label" if hidden[name] == "label" else "read by the checks only"
        use = hidden[name]
        return f"{{{{{name}}}}} is {what} (input.{name}.use = {use!r}): never shown to the model"
    if role == "system" and name not in _CARRIED:
        return (
            f"{{{{{name}}}}}: the system message is shared by every record (it comes first, "
            "so providers cache it once); put record fields in prompts.generate"
        )
    if name in _CARRIED:
        return (
            f"{{{{{name}}}}}: a record's calls form one conversation, which carries "
            f"{_CARRIED[name]} to every call; the prompt only asks for the next step"
        )
    known = ", ".join(sorted(names)) or "none"
    return f"unknown placeholder {{{{{name}}}}} (known here: {known})"


def _feedback(r: _Reader) -> tuple[dict[str, Any], dict[str, Any]]:
    """The feedback schema and the fields the loop reads from it."""
    schema = r.get("feedback.schema", (dict, str))
    if isinstance(schema, str):
        try:
            schema = orjson.loads(schema)
        except orjson.JSONDecodeError as err:
            raise r.fail("feedback.schema", f"invalid JSON: {err}") from err
    if (
        not isinstance(schema, dict)
        or schema.get("type") != "object"
        or not isinstance(schema.get("properties"), dict)
    ):
        raise r.fail("feedback.schema", "must be an object schema with properties")
    props: dict[str, Any] = schema["properties"]
    fields: dict[str, Any] = {
        "actions_field": r.get("feedback.actions_field", str, "actions"),
        "done_field": r.get("feedback.done_field", str, "done"),
        "score_field": r.get("feedback.score_field", str, None),
    }
    for key, want in (
        ("actions_field", "array"),
        ("done_field", "boolean"),
        ("score_field", "number"),
    ):
        name = fields[key]
        if name is None:
            continue
        prop = props.get(name)
        if not isinstance(prop, dict):
            raise r.fail(f"feedback.{key}", f"{name!r} is not a property of feedback.schema")
        if prop.get("type") != want and not (want == "number" and prop.get("type") == "integer"):
            raise r.fail(f"feedback.{key}", f"property {name!r} must have type {want!r}")
    score_from = tuple(r.get("feedback.score_from", list, []))
    for i, name in enumerate(score_from):
        if not isinstance(name, str) or name not in props:
            raise r.fail(f"feedback.score_from[{i}]", f"{name!r} is not a property")
    if score_from and fields["score_field"] is None:
        raise r.fail("feedback.score_from", "needs feedback.score_field")
    fields["score_from"] = score_from
    return schema, fields


def _hooks(r: _Reader, path: Path, raw: bytes) -> tuple[ModuleType | None, str]:
    """The hooks module (None without one) and the job's content hash, the hooks included."""
    digest = hashlib.sha256(raw)
    name = r.get("hooks.file", str, None)
    if name is None:
        return None, digest.hexdigest()
    hooks_path = (path.parent / name).resolve()
    if not hooks_path.is_file():
        raise r.fail("hooks.file", f"no such file: {hooks_path}")
    spec = importlib.util.spec_from_file_location(f"refine_job_hooks_{hooks_path.stem}", hooks_path)
    if spec is None or spec.loader is None:
        raise r.fail("hooks.file", f"cannot load {hooks_path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # a broken hook file is the job's error, not ours
        raise r.fail("hooks.file", f"{type(err).__name__}: {err}") from err
    digest.update(hooks_path.read_bytes())
    return module, digest.hexdigest()


def _hook(r: _Reader, module: ModuleType | None, name: str) -> Any:
    hook = getattr(module, name, None)
    if hook is not None and not callable(hook):
        raise r.fail("hooks.file", f"{name} must be a function")
    problem = None if hook is None else signature_problem(hook)
    if problem is not None:
        raise r.fail("hooks.file", f"{name} {problem}")
    return hook


def _metrics(r: _Reader, module: ModuleType | None) -> dict[str, MetricSpec]:
    """The hooks' ``METRICS``: metric name -> ``MetricSpec`` (none without it)."""
    declared = getattr(module, "METRICS", None)
    if declared is None:
        return {}
    if not isinstance(declared, Mapping):
        raise r.fail("hooks.file", "METRICS must be a mapping of metric name to MetricSpec")
    for name, spec in declared.items():
        if not isinstance(name, str) or not isinstance(spec, MetricSpec):
            raise r.fail("hooks.file", f"METRICS[{name!r}] must be a MetricSpec")
    return dict(declared)


def _runs_programs(r: _Reader, module: ModuleType | None) -> bool:
    """The hooks' ``RUNS_PROGRAMS``: whether they (or their answer kind) execute programs."""
    declared = getattr(module, "RUNS_PROGRAMS", False)
    if not isinstance(declared, bool):
        raise r.fail("hooks.file", "RUNS_PROGRAMS must be True or False")
    return declared


def _output(r: _Reader, module: ModuleType | None) -> tuple[AnswerKind, str]:
    """The kind of answer (built in, or the hooks' ``KIND``) and the selection rule."""
    plugged = getattr(module, "KIND", None)
    name = r.get("output.kind", str, None if plugged is not None else "text")
    answer_kind: AnswerKind
    if plugged is not None:
        answer_kind = plugged
        if name is not None and name != answer_kind.name:
            raise r.fail("output.kind", f"the hooks define kind {answer_kind.name!r}, not {name!r}")
    elif name in BUILTIN_ANSWER_KINDS:
        answer_kind = BUILTIN_ANSWER_KINDS[name]
    else:
        known = ", ".join(BUILTIN_ANSWER_KINDS)
        raise r.fail("output.kind", f"must be one of {known}, or a KIND defined by the hooks")
    select = r.get("output.select", str, "default")
    if select != "default" and select not in answer_kind.selections:
        known = ", ".join(["default", *answer_kind.selections])
        raise r.fail("output.select", f"kind {answer_kind.name!r} offers {known}")
    return answer_kind, select


def _strategies(r: _Reader) -> Strategies:
    samples = r.get("strategies.samples", int, 1)
    if not 1 <= samples <= MAX_SAMPLES:
        raise r.fail("strategies.samples", f"must be 1 to {MAX_SAMPLES}")
    base = Strategies()
    return Strategies(
        samples=samples,
        sample_temperature=float(
            r.get("strategies.sample_temperature", (int, float), base.sample_temperature)
        ),
        restart=r.get("strategies.restart", bool, False),
        copy_retry=r.get("strategies.copy_retry", bool, False),
        copy_temperature=float(
            r.get("strategies.copy_temperature", (int, float), base.copy_temperature)
        ),
        repair=r.get("strategies.repair", bool, True),
    )
