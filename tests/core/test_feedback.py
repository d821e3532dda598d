"""Feedback: tolerant parsing, normalisation, rendering for prompts, and code extraction."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.core.feedback import normalize, parse_feedback, render_feedback
from pipeline.errors import FeedbackParseError

FIELDS: dict[str, Any] = {"actions_field": "actions", "done_field": "done", "score_field": "score"}


def parse(text: str) -> dict[str, Any]:
    """Parse with the usual field names (actions, done, score)."""
    return parse_feedback(text, **FIELDS)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            '{"actions": ["use a set"], "done": false, "score": 6}',
            {"actions": ["use a set"], "done": False, "score": 6.0},
            id="bare-json",
        ),
        pytest.param(
            '  \n{"actions": [], "done": true, "score": 10}\n  ',
            {"actions": [], "done": True, "score": 10.0},
            id="bare-json-with-whitespace",
        ),
        pytest.param(
            'Here is my review:\n```json\n{"actions": ["a"], "done": false, "score": 4}\n```\nBye',
            {"actions": ["a"], "done": False, "score": 4.0},
            id="json-fence",
        ),
        pytest.param(
            '```\n{"actions": ["a"], "done": false}\n```',
            {"actions": ["a"], "done": False, "score": None},
            id="plain-fence",
        ),
        pytest.param(
            'My review: {"actions": ["a", "b"], "done": false, "score": 3} hope it helps.',
            {"actions": ["a", "b"], "done": False, "score": 3.0},
            id="prose-around-object",
        ),
        pytest.param(
            '{"actions": ["a", "b",], "done": false, "score": 5,}',
            {"actions": ["a", "b"], "done": False, "score": 5.0},
            id="trailing-commas",
        ),
        pytest.param(
            '{"actions": ["return true early, not null",], "done": false,}',
            {"actions": ["return true early, not null"], "done": False},
            id="trailing-commas-keep-json-words-in-strings",
        ),
        pytest.param(
            "{'actions': ['a'], 'done': True, 'score': None}",
            {"actions": ["a"], "done": True, "score": None},
            id="python-literals",
        ),
        pytest.param(
            "{'actions': ['a'], 'done': false, 'score': 2,}",
            {"actions": ["a"], "done": False, "score": 2.0},
            id="single-quotes-json-literals-trailing-comma",
        ),
        pytest.param(
            '{"actions": [], "done": "yes"}', {"actions": [], "done": True}, id="done-yes"
        ),
        pytest.param(
            '{"actions": [], "done": "True"}', {"actions": [], "done": True}, id="done-str-true"
        ),
        pytest.param('{"actions": [], "done": 1}', {"actions": [], "done": True}, id="done-one"),
        pytest.param('{"actions": [], "done": "no"}', {"actions": [], "done": False}, id="done-no"),
        pytest.param('{"actions": [], "done": 0}', {"actions": [], "done": False}, id="done-zero"),
        pytest.param(
            '{"actions": [], "done": "maybe"}', {"actions": [], "done": False}, id="done-unclear"
        ),
        pytest.param('{"actions": []}', {"actions": [], "done": False}, id="done-missing"),
        pytest.param(
            '{"actions": [], "done": null}', {"actions": [], "done": False}, id="done-null"
        ),
        pytest.param('{"score": "8/10"}', {"score": 8.0}, id="score-out-of-ten"),
        pytest.param('{"score": " 7 / 10 "}', {"score": 7.0}, id="score-out-of-ten-spaced"),
        pytest.param('{"score": "7.5"}', {"score": 7.5}, id="score-decimal-string"),
        pytest.param('{"score": 9.25}', {"score": 9.25}, id="score-float"),
        pytest.param('{"score": "high"}', {"score": None}, id="score-words"),
        pytest.param('{"score": true}', {"score": None}, id="score-bool"),
        pytest.param('{"score": [8]}', {"score": None}, id="score-list"),
        pytest.param(
            '{"actions": "rename x to total"}', {"actions": ["rename x to total"]}, id="action-str"
        ),
        pytest.param('{"actions": "  "}', {"actions": []}, id="action-blank-string"),
        pytest.param('{"done": false}', {"actions": []}, id="actions-missing"),
        pytest.param(
            '{"actions": ["a", {"line": 3, "fix": "b"}]}',
            {"actions": ["a", '{"line":3,"fix":"b"}']},
            id="action-object-as-json",
        ),
        pytest.param('{"actions": 5}', {"actions": ["5"]}, id="actions-number"),
        pytest.param(
            '{"actions": [], "speed": "fine", "readability": "ok"}',
            {"speed": "fine", "readability": "ok"},
            id="other-fields-pass-through",
        ),
    ],
)
def test_parse_feedback_tolerates_formats(text: str, expected: dict[str, Any]) -> None:
    """Common ways models wrap or misspell JSON still give the normalised fields."""
    parsed = parse(text)
    assert {k: parsed[k] for k in expected} == expected
    # the fields the loop relies on are always present and normalised
    assert isinstance(parsed["actions"], list)
    assert all(isinstance(a, str) for a in parsed["actions"])
    assert isinstance(parsed["done"], bool)
    assert parsed["score"] is None or isinstance(parsed["score"], float)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("  \n\t ", id="whitespace"),
        pytest.param("The code looks good, ship it.", id="prose"),
        pytest.param('["use a set", "rename x"]', id="json-array"),
        pytest.param("42", id="json-number"),
        pytest.param('"done"', id="json-string"),
        pytest.param("{actions: use a set, done: no", id="broken-object"),
        pytest.param("```json\nnot json\n```", id="fence-without-json"),
    ],
)
def test_parse_feedback_failures_raise(text: str) -> None:
    """Text holding no JSON object is a FeedbackParseError (a step error, not a crash)."""
    with pytest.raises(FeedbackParseError):
        parse(text)


def test_python_literal_fallback_keeps_string_contents() -> None:
    """Repairing single-quoted feedback does not change words inside its strings."""
    parsed = parse("{'actions': ['return null, not false, when empty'], 'done': false}")
    assert parsed["actions"] == ["return null, not false, when empty"]


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            {"fixes": "x", "ok": "yes", "score": "8/10"},
            {"fixes": ["x"], "ok": True, "score": "8/10"},
        ),
        ({}, {"fixes": [], "ok": False}),
    ],
)
def test_normalize_uses_the_job_field_names(obj: dict[str, Any], expected: dict[str, Any]) -> None:
    """Custom field names are normalised; with no score field, `score` is left untouched."""
    got = normalize(obj, actions_field="fixes", done_field="ok", score_field=None)
    assert got == expected


def test_normalize_does_not_mutate_its_input() -> None:
    """normalize returns a new dict and leaves the parsed object as it was."""
    obj = {"actions": "a", "done": "yes", "score": "8/10"}
    normalize(obj, **FIELDS)
    assert obj == {"actions": "a", "done": "yes", "score": "8/10"}


@pytest.mark.parametrize(
    ("parsed", "raw", "expected"),
    [
        pytest.param(
            {"actions": ["use a set", "rename x"], "done": False, "score": 6.0},
            "ignored",
            "Actions:\n- use a set\n- rename x\nScore: 6",
            id="actions-and-score",
        ),
        pytest.param(
            {"actions": [], "done": True, "score": 7.5},
            "ignored",
            "Actions: none\nScore: 7.5",
            id="no-actions",
        ),
        pytest.param(
            {"actions": ["a"], "done": False, "score": None},
            "ignored",
            "Actions:\n- a",
            id="no-score",
        ),
        pytest.param(
            {"actions": ["a"], "done": False, "score": 3.0, "speed": "O(n^2) loop", "notes": ""},
            "ignored",
            "Actions:\n- a\nScore: 3\nSpeed: O(n^2) loop",
            id="other-fields-empty-skipped",
        ),
        pytest.param(
            {"actions": ["a"], "done": False, "score": 3.0, "line_refs": [4, 7]},
            "ignored",
            "Actions:\n- a\nScore: 3\nLine refs: [4,7]",
            id="other-field-non-string",
        ),
        pytest.param(None, "  rename x and use a set \n", "rename x and use a set", id="raw"),
    ],
)
def test_render_feedback(parsed: dict[str, Any] | None, raw: str, expected: str) -> None:
    """Parsed feedback renders as a list of actions, then the score and other notes; else raw."""
    assert render_feedback(parsed, raw, **FIELDS) == expected
