"""scripts/smoke_server.py: runs with the standard library alone and reports what happened."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.serving import resolve_model

from .fakes import quiet
from .test_real_server import installed_server

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "smoke_server.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # -I -S: no site-packages, no refine: what a machine without refine's environment has.
    return subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_server_dead_of_sigill_is_reported(tmp_path: Path) -> None:
    """A server killed by SIGILL while loading: FAILED, the signal by name, its log, the fix."""
    binary = tmp_path / "llama-server"
    binary.write_text('#!/bin/sh\necho "load_tensors: loading"\nkill -ILL $$\n')
    binary.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(16))
    done = _run("--bin", str(tmp_path), "--model", str(model))
    assert done.returncode == 1, done.stderr
    assert "FAILED: the server exited while loading; the server: SIGILL" in done.stdout
    assert "load_tensors: loading" in done.stdout
    assert "scripts/install local" in done.stdout


@pytest.mark.slow
def test_the_installed_server_answers(tmp_path: Path) -> None:
    """The installed build on a real model: the script starts it and prints OK."""
    folder = installed_server().parent
    model = resolve_model("qwen2.5-coder-0.5b", log=quiet).path
    done = _run("--bin", str(folder), "--model", str(model))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "build features:" in done.stdout
    assert "\nOK: loaded in" in done.stdout
