"""Batch lines, the ledger and the driver's settings: the pure parts, by tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.backends.batch.api import BatchInfo
from pipeline.backends.batch.config import BatchConfig
from pipeline.backends.batch.ledger import Ledger, read_ledger
from pipeline.backends.batch.lines import (
    LineReply,
    custom_id,
    input_line,
    line_index,
    read_result,
    request_body,
    split,
)
from pipeline.core.steps import Request
from pipeline.errors import AuthError, BatchFailed, CallError, ConfigError
from pipeline.runs.progress import Counters


@pytest.mark.parametrize(
    ("sizes", "max_lines", "max_bytes", "files"),
    [
        ([], 3, 100, []),
        ([10] * 7, 3, 1000, [(0, 3), (3, 6), (6, 7)]),
        ([10] * 4, 50, 25, [(0, 2), (2, 4)]),
        ([10, 30, 10], 50, 25, [(0, 1), (1, 2), (2, 3)]),  # a line too big goes alone
        ([5, 5, 5, 5], 2, 10, [(0, 2), (2, 4)]),  # both limits at once
        ([10] * 3, 3, 30, [(0, 3)]),  # exactly at both limits
    ],
)
def test_split_keeps_each_file_within_both_limits(
    sizes: list[int], max_lines: int, max_bytes: int, files: list[tuple[int, int]]
) -> None:
    """Lines are cut, in order, into files of at most max_lines lines and max_bytes bytes."""
    assert split(sizes, max_lines, max_bytes) == files


@pytest.mark.parametrize(
    ("cid", "token", "index"),
    [
        (custom_id("ab12", 0), "ab12", 0),
        (custom_id("ab12", 49_999), "ab12", 49_999),
        ("ab12-7", "cd34", None),  # another batch's line
        ("ab12-x", "ab12", None),
        ("ab12", "ab12", None),
        (None, "ab12", None),
        (12, "ab12", None),
    ],
)
def test_custom_id_names_its_batch_and_line(cid: Any, token: str, index: int | None) -> None:
    """A custom_id gives back its line position only for the batch whose token it carries."""
    assert line_index(cid, token) == index


@pytest.mark.parametrize(
    ("penalty", "extra", "fields"),
    [
        (None, {}, {}),
        (0.5, {}, {"frequency_penalty": 0.5}),  # a repair's penalty goes as a body field
        (None, {"response_format": {"type": "json_object"}},
         {"response_format": {"type": "json_object"}}),
    ],
)  # fmt: skip
def test_request_body_carries_the_request_and_the_formats_fields(
    penalty: float | None, extra: dict[str, Any], fields: dict[str, Any]
) -> None:
    """A line's body is the request's sampling as sent, the penalty only where set, the
    format's fields added; the cache key stays out (the Batch API has no prompt cache key)."""
    sent = [{"role": "user", "content": "q"}]
    request = Request(
        tuple(sent), temperature=0.2, max_tokens=64, frequency_penalty=penalty, cache_key="r1"
    )
    body = orjson.loads(request_body("m", sent, request, extra))
    base = {"model": "m", "messages": sent, "temperature": 0.2, "max_tokens": 64}
    assert body == {**base, **fields}


def test_input_line_wraps_the_body_unchanged() -> None:
    """An input line is the body as given, under its custom_id, for /v1/chat/completions."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "é\n"}]})
    line = input_line("tok-3", body)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    obj = orjson.loads(line)
    assert obj == {
        "custom_id": "tok-3",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": orjson.loads(body),
    }


def _ok(content: str | None = "hi", refusal: str | None = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": content, "refusal": refusal}
    body = {
        "choices": [{"message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }
    return {"custom_id": "t-0", "response": {"status_code": 200, "body": body}, "error": None}


def _status(code: int) -> dict[str, Any]:
    body = {"error": {"message": "nope", "type": "x"}}
    return {"custom_id": "t-0", "response": {"status_code": code, "body": body}, "error": None}


def _error(code: str) -> dict[str, Any]:
    return {"custom_id": "t-0", "response": None, "error": {"code": code, "message": "m"}}


@pytest.mark.parametrize(
    ("line", "outcome", "status"),
    [
        (_ok(), "answer", None),
        (_ok(content=None, refusal="no"), "refusal", None),
        (_ok(content=""), "empty", None),
        (_status(500), "http_500", 500),
        (_status(429), "http_429", 429),
        (_status(400), "http_400", 400),
        (_status(401), "auth", 401),
        (_status(403), "auth", 403),
        (_error("batch_expired"), "unfinished", None),
        (_error("batch_cancelled"), "unfinished", None),
        (_error("server_error"), "bad_response", None),
        ({"custom_id": "t-0"}, "bad_response", None),
    ],
)
def test_read_result_classifies_every_line(
    line: dict[str, Any], outcome: str, status: int | None
) -> None:
    """An output/error line is an answer, a failure with its status, or a call never run."""
    result = read_result(line)
    if outcome == "answer":
        assert result == LineReply(
            "hi", "stop", {"prompt_tokens": 7, "completion_tokens": 3, "cached_tokens": 0}
        )
    elif outcome == "unfinished":
        assert result is None
    else:
        assert isinstance(result, CallError) and result.category == outcome
        assert result.status == status
        assert isinstance(result, AuthError) == (outcome == "auth")


def test_batch_info_reads_the_api_object() -> None:
    """The API's batch object gives the status, files, end time, metadata and errors."""
    info = BatchInfo.from_api(
        {
            "id": "batch_1",
            "status": "failed",
            "created_at": 100,
            "failed_at": 130,
            "input_file_id": "file-1",
            "output_file_id": None,
            "error_file_id": None,
            "metadata": {"refine_token": "abc"},
            "errors": {"data": [{"code": "invalid_url", "message": "bad url", "line": 3}]},
        }
    )
    assert info.terminal and info.ended_at == 130 and info.metadata["refine_token"] == "abc"
    assert [str(e) for e in info.errors] == ["line 3: invalid_url: bad url"]
    failed = BatchFailed(f"batch {info.id} failed validation", info.errors * 7)
    assert "batch batch_1 failed validation: line 3: invalid_url: bad url" in str(failed)
    assert "and 2 more" in str(failed)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, BatchConfig()),
        ({"REFINE_BATCH_MAX_LINES": "3"}, BatchConfig(max_lines=3)),
        (
            {"REFINE_BATCH_MAX_BYTES": "4096", "REFINE_BATCH_POLLS_PER_S": "0.5"},
            BatchConfig(max_bytes=4096, polls_per_s=0.5),
        ),
        ({"REFINE_BATCH_WINDOW": ""}, BatchConfig()),
    ],
)
def test_config_reads_overrides_from_the_environment(
    env: dict[str, str], expected: BatchConfig
) -> None:
    """REFINE_BATCH_<FIELD> variables override the published limits."""
    assert BatchConfig.from_env(env) == expected


@pytest.mark.parametrize(
    "env",
    [
        {"REFINE_BATCH_MAX_LINES": "many"},
        {"REFINE_BATCH_WINDOW": "0"},
        {"REFINE_BATCH_CREATES_PER_S": "-1"},
    ],
)
def test_config_refuses_bad_overrides(env: dict[str, str]) -> None:
    """A limit that is not a positive number is a configuration error naming the variable."""
    with pytest.raises(ConfigError, match="REFINE_BATCH_"):
        BatchConfig.from_env(env)


def _ledger(path: Path) -> Ledger:
    return Ledger(path, fsync=False, warn=lambda _: None)


def test_ledger_replays_each_batch_to_its_state(tmp_path: Path) -> None:
    """Replaying the ledger gives open batches, live calls, counted failures and the last round."""
    path = tmp_path / "batches.jsonl"
    ledger = _ledger(path)
    ledger.intent("t1", 1, "generator", "m", [["a", 0, 0], ["b", 2, 1]])
    ledger.uploaded("t1", "file-1")
    ledger.created("t1", "batch_1")
    ledger.intent("t2", 2, "critic", "m", [["c", 1, 0]])
    ledger.intent("t3", 2, "generator", "m", [["d", 0, 0]])
    ledger.uploaded("t3", "file-3")
    ledger.created("t3", "batch_3")
    ledger.collected("t3", "expired", [("d", 0, 500)], ["out-3"])
    ledger.closed("t3", "collected")
    ledger.close()
    state = read_ledger(path)
    assert set(state.entries) == {"t1", "t2"}
    assert state.live_calls() == {"a": ("t1", 0), "b": ("t1", 2)}
    assert state.entries["t1"].files == ["file-1"]
    assert state.entries["t2"].batch_id is None and state.entries["t2"].side == "critic"
    assert state.failures == {("d", 0): [500]}
    assert state.rounds == 2 and state.closed == 1


def test_ledger_torn_tail_is_cut_with_a_warning(tmp_path: Path) -> None:
    """A ledger cut mid-line by a kill loses only that line, with a warning naming the file."""
    path = tmp_path / "batches.jsonl"
    ledger = _ledger(path)
    ledger.intent("t1", 1, "generator", "m", [["a", 0, 0]])
    ledger.created("t1", "batch_1")
    ledger.close()
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    warnings: list[str] = []
    again = Ledger(path, fsync=False, warn=warnings.append)
    assert again.state.entries["t1"].batch_id is None  # the torn `created` is gone
    assert any("batches.jsonl" in w and "torn" in w for w in warnings)
    again.created("t1", "batch_1")
    again.close()
    assert read_ledger(path).entries["t1"].batch_id == "batch_1"


def test_ledger_compaction_keeps_open_batches_and_pending_failures(tmp_path: Path) -> None:
    """A ledger of mostly forgotten batches is rewritten smaller with the same open state."""
    path = tmp_path / "batches.jsonl"
    ledger = _ledger(path)
    big = [[f"r{i}-" + "x" * 40, 0, 0] for i in range(20_000)]
    ledger.intent("old", 1, "generator", "m", big)
    ledger.collected("old", "completed", [("keep", 3, 500), ("drop", 1, 429)], [])
    ledger.closed("old", "collected")
    ledger.intent("open", 2, "generator", "m", [["keep", 3, 1]])
    ledger.uploaded("open", "file-9")
    ledger.created("open", "batch_9")
    before = path.stat().st_size
    ledger.compact(lambda rid, n: rid == "keep")
    ledger.close()
    state = read_ledger(path)
    assert path.stat().st_size < before / 10
    assert set(state.entries) == {"open"} and state.entries["open"].batch_id == "batch_9"
    assert state.entries["open"].files == ["file-9"]
    assert state.failures == {("keep", 3): [500]}
    assert state.rounds == 2


def test_progress_line_shows_batches_by_status_and_records_by_step() -> None:
    """With --batch the progress line adds open batches by status and records by next step."""
    counters = Counters(lines=10)
    assert "batches" not in counters.line()
    counters.batches = {"in_progress": 2, "validating": 1}
    counters.waiting = {"feedback": 4, "generate": 6}
    line = counters.line()
    assert line.endswith(
        "; batches: 2 in_progress, 1 validating; next step: 4 feedback, 6 generate"
    )
    assert counters.snapshot()["batches"] == {"in_progress": 2, "validating": 1}
