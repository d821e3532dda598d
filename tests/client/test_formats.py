"""The structured-output ladder as pure functions: request bodies and stepping down."""

from __future__ import annotations

import pytest

from pipeline.client.formats import (
    FORMAT_VOTES,
    FormatLadder,
    Refusal,
    format_refused,
    refusal_of,
    schema_instruction,
)

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["done"],
    "properties": {"done": {"type": "boolean"}},
}
MESSAGES = [{"role": "user", "content": "Review it."}]


def test_request_at_each_level() -> None:
    """json_schema sends the schema (strict if it can); lower levels spell it out in the prompt."""
    ladder = FormatLadder()
    sent, extra = ladder.request(MESSAGES, SCHEMA, 0)
    assert extra["response_format"]["type"] == "json_schema"
    assert extra["response_format"]["json_schema"]["strict"] is True
    assert sent == MESSAGES
    sent, extra = ladder.request(MESSAGES, SCHEMA, 1)
    assert extra == {"response_format": {"type": "json_object", "schema": SCHEMA}}
    assert "JSON Schema" in sent[-1]["content"]
    sent, extra = ladder.request(MESSAGES, SCHEMA, 2)
    assert extra == {} and "JSON Schema" in sent[-1]["content"]
    assert MESSAGES[0]["content"] == "Review it."  # the caller's messages are not changed
    assert ladder.request(MESSAGES, None, 0) == (MESSAGES, {})


BOUNDED = {
    "type": "object",
    "additionalProperties": False,
    "required": ["why", "done"],
    "properties": {
        "why": {"type": "string", "maxLength": 40, "description": "what is wrong, or 'fine'"},
        "done": {"type": "boolean"},
    },
}


def test_a_grammar_gets_the_whole_schema_and_the_model_sees_it_in_the_prompt() -> None:
    """A server enforcing json_schema by a grammar (llama.cpp's) gets the string lengths,
    and the prompt spells the schema out, field descriptions included: such a server shows
    the model nothing of it. Other json_schema servers get neither."""
    sent, extra = FormatLadder(grammar=True).request(MESSAGES, BOUNDED, 0)
    assert extra["response_format"]["json_schema"]["schema"] == BOUNDED
    assert sent[-1]["content"] == "Review it." + schema_instruction(BOUNDED)
    assert "what is wrong, or 'fine'" in sent[-1]["content"]
    sent, extra = FormatLadder().request(MESSAGES, BOUNDED, 0)
    assert "maxLength" not in str(extra["response_format"]["json_schema"]["schema"])
    assert sent == MESSAGES
    # lower levels are as without the grammar: the instruction once, never twice
    for level in (1, 2):
        assert FormatLadder(grammar=True).request(
            MESSAGES, BOUNDED, level
        ) == FormatLadder().request(MESSAGES, BOUNDED, level)
        sent, _ = FormatLadder(grammar=True).request(MESSAGES, BOUNDED, level)
        assert sent[-1]["content"].count("JSON Schema") == 1
    assert MESSAGES[0]["content"] == "Review it."


@pytest.mark.parametrize(
    ("status", "message", "refused"),
    [
        (400, "response_format json_schema is not supported", True),
        (422, "unknown field: grammar", True),
        (500, "validation error in response_format", True),
        (500, "internal error", False),
        (400, "prompt too long", False),
    ],
)
def test_format_refused_table(status: int, message: str, refused: bool) -> None:
    """Only answers naming the format count as a refusal of it."""
    assert format_refused(status, message) is refused


def test_named_refusal_moves_the_pool_a_bare_400_only_the_call() -> None:
    """A refusal naming the format moves the pool down; a bare 400 moves this call only."""
    ladder = FormatLadder()
    assert ladder.refused(400, "response_format not supported", 0) == 1
    assert ladder.level == 1
    assert ladder.refused(400, "bad request", 1) == 2
    assert ladder.level == 1
    assert ladder.refused(400, "bad request", 2) is None  # nothing left below plain text
    assert ladder.refused(503, "busy", 1) is None


def test_calls_that_succeed_lower_vote_the_pool_down() -> None:
    """After FORMAT_VOTES calls succeed one level down, the whole pool starts there."""
    ladder = FormatLadder()
    for _ in range(FORMAT_VOTES - 1):
        ladder.succeeded(1)
    assert ladder.level == 0
    ladder.succeeded(1)
    assert ladder.level == 1


@pytest.mark.parametrize(
    ("status", "message", "code", "param", "expected"),
    [
        # an error about the format: the ladder steps down
        (400, "Invalid parameter: 'response_format' is not supported.", None, None, "format"),
        (400, "Unsupported value", "unsupported_value", "response_format", "format"),
        (422, "json_schema is not supported by this server", None, None, "format"),
        (500, "1 validation error: response_format extra fields", None, None, "format"),
        # a 400 naming no cause at all: maybe the format
        (400, "Bad Request", None, None, "unnamed"),
        (400, "Error code: 400", None, None, "unnamed"),
        (422, "", None, None, "unnamed"),
        # a prompt past the context window, as OpenAI, vLLM and llama.cpp say it
        (
            400,
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9000 tokens (8700 in the messages, 300 in the response_format).",
            "context_length_exceeded",
            "messages",
            "other",
        ),
        (400, "Please reduce the length of the messages.", None, None, "other"),
        (400, "the request exceeds the available context size", None, None, "other"),
        (400, "m", "exceed_context_size_error", None, "other"),
        # any other named cause fails the call at once
        (400, "max_tokens is too large: 99999", None, "max_tokens", "other"),
        (503, "The engine is currently overloaded", None, None, "other"),
    ],
)
def test_refusal_of_table(
    status: int, message: str, code: str | None, param: str | None, expected: str
) -> None:
    """Only an error naming the format steps down for the pool, a bare one for the call;
    a context-length error (even one mentioning response_format) or any other is no refusal."""
    assert refusal_of(status, message, code, param) is Refusal(expected)


def test_a_context_length_400_moves_nothing() -> None:
    """The ladder answers None to a context-length 400: the call fails, the pool stays."""
    ladder = FormatLadder()
    message = "This model's maximum context length is 100 tokens."
    assert ladder.refused(400, message, 0, code="context_length_exceeded") is None
    assert ladder.refused(400, "Bad Request", 0, code="context_length_exceeded") is None
    assert ladder.level == 0
