"""Jobs: the built-in job, validation that names the offending key, rendering, hooks."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.jobs import InputField, builtin_jobs, render
from pipeline.core.loader import load_job
from pipeline.core.strategies import Strategies
from pipeline.errors import ConfigError, JobError

BASE = """\
name = "t"
description = "a test job"

[input.task]
type = "string"
description = "what to do"

[input.answer]
type = "any"
required = false
use = "label"

[prompts]
system = "You help with tasks."
generate = "Do {{task}}"
feedback = "Review the answer above for {{task}}; checks found {{findings}}"
refine = "Improve the answer above"

[feedback]
score_field = "score"

[feedback.schema]
type = "object"

[feedback.schema.properties.actions]
type = "array"

[feedback.schema.properties.done]
type = "boolean"

[feedback.schema.properties.score]
type = "number"

[stop]
max_iters = 2
score_threshold = 8

[model]
temperature = 0.2
max_tokens = 256

[output]
kind = "text"
"""


def write_job(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    """A job file holding ``text``."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def edit(old: str, new: str) -> str:
    """BASE with ``old`` replaced by ``new`` (which must occur exactly once)."""
    assert BASE.count(old) == 1, old
    return BASE.replace(old, new)


def with_schema(value: str) -> str:
    """BASE with the [feedback.schema] tables replaced by ``schema = <value>``."""
    start, end = BASE.index("[feedback.schema]"), BASE.index("[stop]")
    head = BASE[:start].replace(
        'score_field = "score"\n', f'score_field = "score"\nschema = {value}\n'
    )
    return head + BASE[end:]


SCHEMA_JSON = (
    '\'{"type": "object", "properties": {"actions": {"type": "array"}, '
    '"done": {"type": "boolean"}, "score": {"type": "integer"}}}\''
)


# -- the built-in job ------------------------------------------------------------------------


def test_builtin_code_improve_has_what_the_loop_needs() -> None:
    """code-improve takes a `task`, scores its feedback and keeps code apart from its tests."""
    job = load_job("code-improve")
    assert job.name == "code-improve"
    assert job.inputs == (InputField("task", "string", True, job.inputs[0].description),)
    assert job.scored and job.score_field == "score"
    assert job.score_threshold is not None and job.max_iters >= 1
    assert job.answer_kind.name == "code-with-tests" and "pooled" in job.answer_kind.selections
    assert job.checker is not None and job.evaluator is not None
    assert job.strategies == Strategies() and job.select == "default"
    assert job.system_prompt and "{{task}}" in job.generate_prompt
    assert "{{findings}}" in job.feedback_prompt
    props = job.feedback_schema["properties"]
    assert props[job.actions_field]["type"] == "array"
    assert props[job.done_field]["type"] == "boolean"
    assert props[job.score_field]["type"] in ("integer", "number")
    assert {job.actions_field, job.done_field, job.score_field} <= set(
        job.feedback_schema["required"]
    )


def test_builtin_by_name_equals_builtin_by_path() -> None:
    """A built-in job loads the same by name or by its file path."""
    path = builtin_jobs()["code-improve"]
    by_name, by_path = load_job("code-improve"), load_job(str(path))
    assert by_name == by_path
    assert by_name.content_hash == by_path.content_hash


def test_unknown_job_name_lists_the_builtins() -> None:
    """An unknown name that is not a file is a JobError listing the built-in jobs."""
    with pytest.raises(JobError) as info:
        load_job("no-such-job")
    assert info.value.key == "job"
    assert "code-improve" in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_missing_job_file_is_a_job_error(tmp_path: Path) -> None:
    """A .toml path that does not exist is a JobError, not an OSError."""
    with pytest.raises(JobError) as info:
        load_job(str(tmp_path / "absent.toml"))
    assert info.value.key == "file"


# -- a valid custom job ----------------------------------------------------------------------


def test_valid_job_file_loads_with_its_values(tmp_path: Path) -> None:
    """Every field of a valid job file reaches the Job (the base of the broken-job table)."""
    job = load_job(str(write_job(tmp_path, BASE)))
    assert job.name == "t" and job.description == "a test job"
    assert job.inputs == (
        InputField("task", "string", True, "what to do"),
        InputField("answer", "any", False, "", use="label"),
    )
    assert job.system_prompt == "You help with tasks."
    assert (job.actions_field, job.done_field, job.score_field) == ("actions", "done", "score")
    assert (job.max_iters, job.score_threshold) == (2, 8.0)
    assert (job.temperature, job.max_tokens, job.answer_kind.name) == (0.2, 256, "text")
    assert job.evaluator is None


def test_defaults_apply_when_optional_tables_are_absent(tmp_path: Path) -> None:
    """Without [stop], [model], [output] or a score field the documented defaults hold."""
    text = BASE.split("[stop]")[0].replace('score_field = "score"\n', "")
    job = load_job(str(write_job(tmp_path, text)))
    assert job.score_field is None and not job.scored
    assert (job.max_iters, job.score_threshold) == (3, None)
    assert (job.temperature, job.max_tokens, job.answer_kind.name) == (0.7, 1024, "text")
    assert job.strategies == Strategies() and job.select == "default"


def test_strategies_table_turns_strategies_on(tmp_path: Path) -> None:
    """[strategies] names the extra calls a job makes; absent, plain Self-Refine."""
    text = BASE + "\n[strategies]\nsamples = 3\nrestart = true\nrepair = false\n"
    job = load_job(str(write_job(tmp_path, text)))
    assert job.strategies == Strategies(samples=3, restart=True, repair=False)
    assert job.strategies.names == ("samples", "restart")


def test_schema_may_be_a_json_string(tmp_path: Path) -> None:
    """feedback.schema given as a JSON string is parsed like the TOML table."""
    job = load_job(str(write_job(tmp_path, with_schema(SCHEMA_JSON))))
    assert job.feedback_schema["properties"]["score"] == {"type": "integer"}


def test_content_hash_follows_the_file_content(tmp_path: Path) -> None:
    """The same job text hashes the same; any change to it changes the hash."""
    a = load_job(str(write_job(tmp_path, BASE, "a.toml")))
    b = load_job(str(write_job(tmp_path, BASE, "b.toml")))
    c = load_job(str(write_job(tmp_path, edit("max_iters = 2", "max_iters = 3"), "c.toml")))
    assert a.content_hash == b.content_hash
    assert a.content_hash != c.content_hash


# -- broken jobs -----------------------------------------------------------------------------

BROKEN = [
    pytest.param(
        edit('refine = "Improve the answer above"\n', ""), "prompts.refine", id="no-refine"
    ),
    pytest.param(
        edit("Improve the answer above", "Improve {{output}} using {{feedback}}"),
        "prompts.refine",
        id="refine-carrying-its-own-answer",
    ),
    pytest.param(
        edit("Improve the answer above", "Improve it; earlier: {{history}}"),
        "prompts.refine",
        id="refine-with-template-history",
    ),
    pytest.param(edit("Do {{task}}", "Do it"), "prompts.generate", id="input-not-in-generate"),
    pytest.param(
        edit("Do {{task}}", "Do {{task}}, like {{answer}}"), "prompts.generate", id="label-shown"
    ),
    pytest.param(
        edit("Improve the answer above", "Improve it toward {{answer}}"),
        "prompts.refine",
        id="label-in-refine",
    ),
    pytest.param(
        edit("Do {{task}}", "Do {{task}} better than {{findings}}"),
        "prompts.generate",
        id="findings-in-generate",
    ),
    pytest.param(
        edit("You help with tasks.", "You help with {{task}}."),
        "prompts.system",
        id="record-field-in-system",
    ),
    pytest.param(edit('use = "label"', 'use = "secret"'), "input.answer.use", id="bad-field-use"),
    pytest.param(edit('kind = "text"', 'kind = "html"'), "output.kind", id="bad-kind"),
    pytest.param(BASE + 'select = "pooled"\n', "output.select", id="select-the-answer-kind-lacks"),
    pytest.param(BASE + "\n[strategies]\nsamples = 0\n", "strategies.samples", id="samples-0"),
    pytest.param(
        BASE + '\n[strategies]\nrestart = "yes"\n', "strategies.restart", id="restart-not-bool"
    ),
    pytest.param(
        BASE + "\n[strategies]\nredraft = true\n", "strategies.redraft", id="unknown-strategy"
    ),
    pytest.param(edit("Do {{task}}", "Do {{taks}}"), "prompts.generate", id="unknown-placeholder"),
    pytest.param('colour = "red"\n' + BASE, "colour", id="unknown-top-level-key"),
    pytest.param(edit('name = "t"', "name = 3"), "name", id="name-not-string"),
    pytest.param(edit('name = "t"\n', ""), "name", id="missing-name"),
    pytest.param(edit("max_iters = 2", 'max_iters = "2"'), "stop.max_iters", id="max-iters-str"),
    pytest.param(edit("max_iters = 2", "max_iters = 2.0"), "stop.max_iters", id="max-iters-float"),
    pytest.param(
        edit("temperature = 0.2", "temperature = true"), "model.temperature", id="temp-bool"
    ),
    pytest.param(edit("max_tokens = 256", "max_tokens = 0"), "model.max_tokens", id="max-tokens-0"),
    pytest.param(edit('type = "string"', 'type = "str"'), "input.task.type", id="bad-input-type"),
    pytest.param(
        edit('type = "string"', 'type = "string"\nrequired = "yes"'),
        "input.task.required",
        id="required-not-bool",
    ),
    pytest.param(
        edit("[input.task]", '[input.output]\ntype = "string"\n\n[input.task]'),
        "input.output",
        id="reserved-input-name",
    ),
    pytest.param(
        edit('[feedback.schema]\ntype = "object"', '[feedback.schema]\ntype = "array"'),
        "feedback.schema",
        id="schema-not-object",
    ),
    pytest.param(with_schema("3"), "feedback.schema", id="schema-not-table"),
    pytest.param(with_schema("'{\"type\": '"), "feedback.schema", id="schema-invalid-json"),
    pytest.param(
        with_schema(SCHEMA_JSON.replace('"object"', '"array"')),
        "feedback.schema",
        id="schema-json-not-object-schema",
    ),
    pytest.param(
        edit('properties.done]\ntype = "boolean"', 'properties.done]\ntype = "string"'),
        "feedback.done_field",
        id="done-not-boolean",
    ),
    pytest.param(
        edit('properties.actions]\ntype = "array"', 'properties.actions]\ntype = "string"'),
        "feedback.actions_field",
        id="actions-not-array",
    ),
    pytest.param(
        edit('score_field = "score"', 'score_field = "rating"'),
        "feedback.score_field",
        id="score-field-not-in-schema",
    ),
    pytest.param(
        edit('score_field = "score"', 'score_field = "score"\ndone_field = "finished"'),
        "feedback.done_field",
        id="done-field-not-in-schema",
    ),
    pytest.param(
        edit('score_field = "score"\n', ""),
        "stop.score_threshold",
        id="threshold-without-score-field",
    ),
    pytest.param(
        edit("max_iters = 2", "max_iters = -1"), "stop.max_iters", id="negative-max-iters"
    ),
    pytest.param(edit('name = "t"', 'name = "t'), "toml", id="invalid-toml"),
    pytest.param(BASE + '\n[hooks]\nfile = "absent.py"\n', "hooks.file", id="hooks-file-missing"),
]


@pytest.mark.parametrize(("text", "key"), BROKEN)
def test_broken_job_names_the_offending_key(tmp_path: Path, text: str, key: str) -> None:
    """Each invalid job file raises a JobError whose key names what is wrong."""
    path = write_job(tmp_path, text)
    with pytest.raises(JobError) as info:
        load_job(str(path))
    assert info.value.key == key
    assert info.value.source == str(path)
    assert key in str(info.value)


@pytest.mark.parametrize("schema", ["'[]'", "'3'", "'\"object\"'"])
def test_schema_json_string_that_is_not_an_object_is_a_job_error(
    tmp_path: Path, schema: str
) -> None:
    """feedback.schema as a JSON string of a non-object is a JobError naming feedback.schema."""
    with pytest.raises(JobError) as info:
        load_job(str(write_job(tmp_path, with_schema(schema))))
    assert info.value.key == "feedback.schema"


def test_schema_property_that_is_not_a_table_is_a_job_error(tmp_path: Path) -> None:
    """A feedback field whose schema property is not an object is a JobError naming the field."""
    text = edit(
        '[feedback.schema.properties.done]\ntype = "boolean"',
        '[feedback.schema.properties]\ndone = "boolean"',
    )
    with pytest.raises(JobError) as info:
        load_job(str(write_job(tmp_path, text)))
    assert info.value.key == "feedback.done_field"


# -- hooks -----------------------------------------------------------------------------------

HOOKS = "def evaluate(fields, output):\n    return {'task': fields['task'], 'chars': len(output)}\n"


def test_hooks_file_provides_the_evaluator(tmp_path: Path) -> None:
    """A hooks file next to the job supplies `evaluate`, called with the fields and the output."""
    (tmp_path / "hooks.py").write_text(HOOKS, encoding="utf-8")
    job = load_job(str(write_job(tmp_path, BASE + '\n[hooks]\nfile = "hooks.py"\n')))
    assert job.evaluator is not None
    assert job.evaluator({"task": "sum"}, "abcd") == {"task": "sum", "chars": 4}


def test_hooks_file_content_changes_the_content_hash(tmp_path: Path) -> None:
    """Editing only the hooks file changes the job's content hash (a different job)."""
    path = write_job(tmp_path, BASE + '\n[hooks]\nfile = "hooks.py"\n')
    hooks = tmp_path / "hooks.py"
    hooks.write_text(HOOKS, encoding="utf-8")
    before = load_job(str(path)).content_hash
    assert load_job(str(path)).content_hash == before
    hooks.write_text(HOOKS + "\n# changed: counts characters\n", encoding="utf-8")
    assert load_job(str(path)).content_hash != before


@pytest.mark.parametrize(
    "hooks",
    [
        "raise RuntimeError('broken hooks')\n",
        "evaluate = 3\n",
        "def evaluate(:\n",
        "RUNS_PROGRAMS = 'yes'\n",
    ],
)
def test_broken_hooks_file_is_a_job_error(tmp_path: Path, hooks: str) -> None:
    """A hooks file that fails to import, whose evaluate is not callable or whose
    RUNS_PROGRAMS is not a bool, is a JobError."""
    (tmp_path / "hooks.py").write_text(hooks, encoding="utf-8")
    with pytest.raises(JobError) as info:
        load_job(str(write_job(tmp_path, BASE + '\n[hooks]\nfile = "hooks.py"\n')))
    assert info.value.key == "hooks.file"


# -- render ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "values", "expected"),
    [
        ("Do {{task}} now", {"task": "x"}, "Do x now"),
        ("{{ task }}|{{task}}", {"task": "x"}, "x|x"),
        ("{{a}}{{b}}", {"a": "1", "b": "2"}, "12"),
        # values are inserted verbatim: no second pass, no regex escapes
        ("{{output}} / {{task}}", {"output": "{{task}}", "task": "T"}, "{{task}} / T"),
        ("{{task}}", {"task": r"a\1b\g<0>"}, r"a\1b\g<0>"),
        # single braces (code, JSON) are not placeholders
        ("f'{x}' {task} {{task}}", {"task": "T"}, "f'{x}' {task} T"),
        ("no placeholders", {}, "no placeholders"),
    ],
)
def test_render_fills_placeholders(template: str, values: dict[str, str], expected: str) -> None:
    """render substitutes each {{name}} once, with the value as plain text."""
    assert render(template, values) == expected


def test_render_without_a_value_raises() -> None:
    """A placeholder with no value is an error, never left in the prompt silently."""
    with pytest.raises(KeyError):
        render("Do {{task}}", {})


@pytest.mark.parametrize(
    ("table", "line", "key"),
    [
        ("[stop]", "max_iter = 3", "stop.max_iter"),
        ("[model]", "temprature = 0.2", "model.temprature"),
        ("[input.task]", "requird = false", "input.task.requird"),
    ],
)
def test_misspelt_key_inside_a_table_is_named(
    tmp_path: Path, table: str, line: str, key: str
) -> None:
    """A misspelt key inside a known table is refused, naming the full dotted key."""
    text = Path(load_job("code-improve").source).read_text()
    path = tmp_path / "job.toml"
    if table in text:
        text = text.replace(table, f"{table}\n{line}", 1)
    else:
        text += f"\n{table}\n{line}\n"
    path.write_text(text)
    with pytest.raises(JobError) as info:
        load_job(str(path))
    assert info.value.key == key


def test_jobs_that_run_programs_say_so() -> None:
    """The built-in jobs whose answers are executed declare it (a run checks the sandbox for
    them); the others do not, nor does a job without hooks."""
    runs = {name for name, path in builtin_jobs().items() if load_job(str(path)).runs_programs}
    assert runs == {"code-improve", "code-optimize", "gsm"}
