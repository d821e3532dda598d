"""llama.cpp's own server (``llama-server``) for one model, with continuous batching.

:class:`LocalServer` is an async context manager that runs ``llama-server`` on a free
loopback port with ``parallel`` slots: the server decodes the slots' sequences together
in one batch (continuous batching), which on a memory-bound CPU gives more tokens per
second in total than one request at a time. It waits until ``GET /health`` answers and
stops the server on exit, also when the body raised or was cancelled. Talk to it with
any OpenAI client at :attr:`LocalServer.base_url`, model :attr:`LocalServer.model`, at
most :attr:`LocalServer.parallel` requests at once; it enforces ``response_format``
``json_schema`` with a grammar built from the schema (:attr:`LocalServer.structured`).

Which binary runs, on which devices, and whether this CPU can run it: ``binary``. A
server that dies of a signal while starting (SIGILL, SIGSEGV) gets a message saying what
to do (``cpu``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import anyio
from anyio.abc import Process

from ..errors import ServerStartError
from ._messages import read_tail
from .binary import GPU_LAYERS_ENV, check_cpu, check_llama_cpp, gpu_layers, list_gpus, server_env
from .caching import cache_args
from .cpu import Build, crash_advice
from .environ import env_count
from .registry import LocalModel

__all__ = [
    "DEFAULT_SLOTS",
    "SLOT_CTX",
    "LocalServer",
    "max_slots",
    "slots_for",
]

DEFAULT_SLOTS = 4
"""Slots (sequences decoded together) when ``--concurrency`` allows. On a 2-core machine
4 slots gave 2.35x the tokens per second of one, and 8 no more (``scripts/bench_local.py``;
the README has the figures)."""

SLOT_CTX = 8192
"""Context tokens per slot: prompt, history and answer of one call must fit; a call that
does not is refused by the server and fails its record. A record is one conversation, and
with two refinements of code it outgrew 4,096 tokens at its last feedback (9 of 32
code-improve records, docs/quality.md); the KV cache costs about 28 KB per token on the
1.5B model, under 1 GB for four slots."""

LOOPBACK = "127.0.0.1"
SLOTS_ENV = "REFINE_LOCAL_SLOTS"
_PORT_TAKEN = ("address already in use", "couldn't bind")

# Started in front of llama-server on Linux: asks the kernel to SIGTERM the server when
# refine dies (PR_SET_PDEATHSIG survives the exec), so a refine killed with SIGKILL, or by
# a SIGTERM it does not handle, leaves no server holding the model's memory. Exits at once
# when refine is already gone; the server keeps the process id, its session and its log.
_TIED_TO_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as error:
    print(f"cannot run {sys.argv[2]}: {error}", file=sys.stderr)
    sys.exit(127)
"""


def max_slots() -> int:
    """``$REFINE_LOCAL_SLOTS`` when set (more suits a GPU), else :data:`DEFAULT_SLOTS`."""
    return env_count(SLOTS_ENV, DEFAULT_SLOTS, least=1, expected="a number of slots >= 1")


def slots_for(concurrency: int, most: int | None = None) -> int:
    """Server slots for a run: no more than the records in flight, at most ``most``."""
    return max(1, min(concurrency, max_slots() if most is None else most))


def _free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _core_count() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


async def _http_status(host: str, port: int, path: str, timeout: float = 2.0) -> int | None:
    """Status code of ``GET path``, or None when nothing answers (yet)."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: application/json\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")
    data = b""
    try:
        with anyio.fail_after(timeout):
            async with await anyio.connect_tcp(host, port) as stream:
                await stream.send(request)
                while b"\r\n" not in data and len(data) < 4096:
                    data += await stream.receive()
    except (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError):
        return None
    status = data.split(b"\r\n", 1)[0].split()
    if len(status) >= 2 and status[0].startswith(b"HTTP/") and status[1].isdigit():
        return int(status[1])
    return None


class _PortTaken(Exception):
    """The server could not bind the port picked for it."""


class LocalServer:
    """llama.cpp's OpenAI-compatible server for one model, as an async context manager.

    ::

        model = await anyio.to_thread.run_sync(resolve_model, None)
        async with LocalServer(model, parallel=slots_for(concurrency)) as server:
            client = AsyncOpenAI(base_url=server.base_url, api_key="local")
            ...  # model=server.model, at most server.parallel requests at once

    The server's output goes to ``log_path`` (``llama-server.log`` in ``log_dir``, or a
    temporary file that is removed after a clean stop). ``program`` replaces the
    installed binary (tests pass a fake server).
    """

    structured: str = "json_schema"
    """llama-server turns ``response_format: json_schema`` into a grammar the answer
    must follow, so the client asks for it natively (and falls back from there)."""

    grammar: bool = True
    """That grammar enforces string lengths and shows the model nothing of the schema:
    the client sends the schema whole and spells it out in the prompt
    (``formats.FormatLadder``)."""

    def __init__(
        self,
        model: LocalModel,
        *,
        log_dir: Path | None = None,
        parallel: int = 1,
        slot_ctx: int = SLOT_CTX,
        n_threads: int | None = None,
        batch_size: int | None = None,
        n_gpu_layers: str | None = None,
        startup_timeout: float = 120.0,
        stop_timeout: float = 5.0,
        extra_args: Sequence[str] = (),
        program: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if parallel < 1:
            raise ValueError("parallel must be >= 1")
        self.local_model = model
        self.parallel = parallel
        self.slot_ctx = slot_ctx
        self.n_threads = n_threads if n_threads is not None else _core_count()
        self.batch_size = batch_size
        self.n_gpu_layers = n_gpu_layers
        self.gpus: tuple[str, ...] = ()
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._log_dir = log_dir
        self._extra_args = tuple(extra_args)
        self._program = tuple(program) if program is not None else None
        self._env = dict(env) if env is not None else None
        self._process: Process | None = None
        self._log_file: IO[bytes] | None = None
        self._log_path: Path | None = None
        self._port: int | None = None
        self._returncode: int | None = None
        self._build: Build | None = None

    # ---- what the runner uses

    @property
    def model(self) -> str:
        """The model name to send in requests (the server's ``--alias``)."""
        return self.local_model.name

    @property
    def n_ctx(self) -> int:
        """Context tokens in all: every slot gets ``slot_ctx`` of its own."""
        return self.parallel * self.slot_ctx

    @property
    def port(self) -> int:
        """The loopback port the server listens on."""
        if self._port is None or self._process is None:
            raise RuntimeError("the local server is not running")
        return self._port

    @property
    def base_url(self) -> str:
        """OpenAI base URL of the running server, ``http://127.0.0.1:PORT/v1``."""
        return f"http://{LOOPBACK}:{self.port}/v1"

    @property
    def log_path(self) -> Path | None:
        """Where the server's stdout and stderr go (None before the first start)."""
        return self._log_path

    @property
    def pid(self) -> int | None:
        """Process id of the server while it runs, else None."""
        return self._process.pid if self._process is not None else None

    @property
    def returncode(self) -> int | None:
        """Exit code once the server has exited (while running or after stop), else None."""
        if self._process is not None:
            return self._process.returncode
        return self._returncode

    @property
    def binary(self) -> Path:
        """The program started: the llama-server binary (a fake's interpreter in tests)."""
        return Path(self._program[0] if self._program else check_llama_cpp())

    @property
    def build(self) -> Build | None:
        """What the binary's build was compiled for, once started (x86-64; else None)."""
        return self._build

    def log_tail(self, lines: int = 25) -> str:
        """The last lines the server wrote, for error messages."""
        return read_tail(self._log_path, lines) if self._log_path else "(no log)"

    def command(self, port: int) -> list[str]:
        """The command line that starts the server on ``port``."""
        program = self._program if self._program is not None else (str(check_llama_cpp()),)
        threads = str(self.n_threads)
        args = [
            *program,
            "--model", str(self.local_model.path),
            "--alias", self.local_model.name,
            "--host", LOOPBACK,
            "--port", str(port),
            "--parallel", str(self.parallel),
            "--ctx-size", str(self.n_ctx),
            "--threads", threads,
            "--threads-batch", threads,
            "--no-webui", *cache_args(),  # a record's next call reuses its computed prefix
        ]  # fmt: skip
        if self.batch_size is not None:
            args += ["--batch-size", str(self.batch_size), "--ubatch-size", str(self.batch_size)]
        if self.n_gpu_layers is not None:
            args += ["--n-gpu-layers", self.n_gpu_layers]
        if not self.gpus:
            # Fitting the model to device memory takes seconds and has nothing to fit on a CPU.
            args += ["--fit", "off"]
        return [*args, *self._extra_args]

    # ---- lifecycle

    async def __aenter__(self) -> Self:
        if self._process is not None:
            raise RuntimeError("the local server is already running")
        if self._program is None:
            self._program = (str(check_llama_cpp()),)
        # Refuses a build for CPU features this CPU lacks, before it can die of them.
        self._build = await anyio.to_thread.run_sync(check_cpu, Path(self._program[0]))
        if self.n_gpu_layers is None:
            self.gpus = await anyio.to_thread.run_sync(list_gpus, self._program, self._env)
            self.n_gpu_layers = gpu_layers(os.environ.get(GPU_LAYERS_ENV), self.gpus)
        if not self.local_model.path.is_file():
            raise ServerStartError(f"model file not found: {self.local_model.path}")
        self._open_log()
        try:
            for _attempt in range(3):
                try:
                    await self._start(_free_port())
                except _PortTaken:
                    continue
                return self
            raise ServerStartError(
                f"the llama.cpp server could not bind a free port on {LOOPBACK} "
                f"(log: {self._log_path})\n{self.log_tail()}"
            )
        except BaseException:
            self._close_log(keep=True)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Keep a temporary log when the body failed; not when it was merely cancelled.
        await self.stop(keep_log=isinstance(exc, Exception))

    async def stop(self, *, keep_log: bool = False) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``stop_timeout``); safe to repeat."""
        with anyio.CancelScope(shield=True):
            process, self._process = self._process, None
            if process is not None:
                await self._terminate(process)
                self._returncode = process.returncode
            self._close_log(keep=keep_log)

    async def _start(self, port: int) -> None:
        assert self._log_file is not None
        process = await anyio.open_process(
            _tied_to_parent(self.command(port)),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=server_env(self._env),
            start_new_session=True,  # a Ctrl-C reaches refine, which then stops the server
        )
        try:
            await self._wait_ready(process, port)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._terminate(process)
            raise
        self._process = process
        self._port = port

    async def _wait_ready(self, process: Process, port: int) -> None:
        deadline = anyio.current_time() + self.startup_timeout
        while True:
            if process.returncode is not None:
                log = self.log_tail()
                if any(sign in log.lower() for sign in _PORT_TAKEN):
                    raise _PortTaken
                advice = crash_advice(process.returncode, self.binary, self._build)
                raise ServerStartError(
                    f"the llama.cpp server exited with code {process.returncode} while "
                    f"loading {self.local_model.path} (log: {self._log_path}):\n{log}"
                    + (f"\n{advice}" if advice else "")
                )
            # /health answers 503 while the model loads and 200 once requests are served.
            if await _http_status(LOOPBACK, port, "/health") == 200:
                return
            if anyio.current_time() >= deadline:
                raise ServerStartError(
                    f"the llama.cpp server did not answer within {self.startup_timeout:g}s "
                    f"(log: {self._log_path}):\n{self.log_tail()}"
                )
            await anyio.sleep(0.25)

    async def _terminate(self, process: Process) -> None:
        if process.returncode is None:
            _signal(process, signal.SIGTERM)
            with anyio.move_on_after(self.stop_timeout):
                await process.wait()
        if process.returncode is None:
            _signal(process, signal.SIGKILL)
            await process.wait()
        await process.aclose()

    def _open_log(self) -> None:
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            self._log_path = self._log_dir / "llama-server.log"
            self._log_file = self._log_path.open("ab")
        else:
            handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in _close_log
                prefix="refine-llama-server-", suffix=".log", delete=False
            )
            self._log_path = Path(handle.name)
            self._log_file = handle

    def _close_log(self, *, keep: bool) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
            if not keep and self._log_dir is None and self._log_path is not None:
                self._log_path.unlink(missing_ok=True)


def _tied_to_parent(command: list[str]) -> list[str]:
    """``command`` run so that it ends with this process (Linux; elsewhere as it is)."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-I", "-c", _TIED_TO_PARENT, str(os.getpid()), *command]


def _signal(process: Process, signum: signal.Signals) -> None:
    """Signal the server's process group (it leads its own session), else the server."""
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError, AttributeError):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)
