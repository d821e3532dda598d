"""The embedded server keeps computed prompts for a record's next call, in a capped host cache."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from pipeline.serving import LocalModel, LocalServer, ServerStartError
from pipeline.serving.caching import CACHE_MIB_ENV, DEFAULT_CACHE_MIB, cache_args

from .fakes import FAKE_SERVER


def _server(tmp_path: Path) -> LocalServer:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(16))
    script = tmp_path / "fake_llama_server.py"
    script.write_text(FAKE_SERVER)
    return LocalServer(
        LocalModel("tiny", model, None), log_dir=tmp_path, program=[sys.executable, str(script)]
    )


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_server_command_reuses_prompts_with_a_capped_host_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server is told to reuse cached prompts, its host cache capped below llama.cpp's 8 GiB."""
    monkeypatch.delenv(CACHE_MIB_ENV, raising=False)
    command = _server(tmp_path).command(8080)
    assert "--cache-prompt" in command
    assert _flag(command, "--cache-ram") == str(DEFAULT_CACHE_MIB)
    assert 0 < DEFAULT_CACHE_MIB < 8192
    assert "--no-cache-prompt" not in command


@pytest.mark.parametrize(("setting", "flag"), [("512", "512"), ("0", "0"), (" 4096 ", "4096")])
def test_cache_cap_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, flag: str
) -> None:
    """REFINE_LOCAL_CACHE_MIB sets the host cache's cap (0 turns it off)."""
    monkeypatch.setenv(CACHE_MIB_ENV, setting)
    assert _flag(_server(tmp_path).command(8080), "--cache-ram") == flag


@pytest.mark.parametrize("setting", ["-1", "2G", "lots"])
def test_cache_cap_setting_rejects_nonsense(monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    """A cap that is not a whole number of MiB is a clear error naming the variable."""
    monkeypatch.setenv(CACHE_MIB_ENV, setting)
    with pytest.raises(ServerStartError, match=CACHE_MIB_ENV):
        cache_args()


def test_explicit_cap_wins_over_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cap given in code is used as given, whatever the environment says."""
    monkeypatch.setenv(CACHE_MIB_ENV, "lots")
    assert cache_args(256) == ["--cache-prompt", "--cache-ram", "256"]


@pytest.mark.anyio
async def test_started_server_gets_the_cache_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flags reach the server process that a run starts (its log shows its argv)."""
    monkeypatch.setenv(CACHE_MIB_ENV, "768")
    monkeypatch.delenv("REFINE_N_GPU_LAYERS", raising=False)
    async with _server(tmp_path):
        await anyio.sleep(0)
    log = (tmp_path / "llama-server.log").read_text()
    assert "--cache-prompt --cache-ram 768" in log
