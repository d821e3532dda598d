"""The public server object: runs the simulated API on its own thread and event loop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from .anthropic import BreakpointCache
from .app import App, Clock
from .caching import PrefixCache
from .config import SimConfig
from .http import HttpServer
from .log import RequestLog
from .tiers import Bill

__all__ = ["Simulator"]

BACKLOG: Final = 8192
# How often batches in flight are advanced between requests (their lines then show up in
# ``requests`` without anyone polling).
BATCH_TICK_S: Final = 0.01
_DEFAULT_CONFIG: Final = SimConfig()


def _raise_nofile_limit() -> None:
    """Best effort: allow thousands of concurrent sockets in this process."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):  # pragma: no cover - platform dependent
        pass


async def _drive_batches(app: App, wake: asyncio.Event) -> None:
    """Advance batches while any is in flight; otherwise sleep until one is created."""
    while True:
        try:
            busy = app.tick()
        except Exception:  # the same error answers the next batch request as a 500
            busy = True
        if busy:
            await asyncio.sleep(BATCH_TICK_S)
        else:
            await wake.wait()
            wake.clear()


class Simulator:
    """The simulated OpenAI and Anthropic server; ``start()`` runs it on its own thread and
    event loop."""

    def __init__(
        self,
        config: SimConfig = _DEFAULT_CONFIG,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: str | Path | None = None,
        *,
        keep_requests: bool = True,
        clock: Clock = time.monotonic,
    ) -> None:
        """``keep_requests=False`` keeps no in-memory log (``requests`` stays empty), for long
        benchmark runs; ``log_path`` still gets every line. ``clock`` is the server's time
        (monotonic seconds): outages, batches, rate limits and cache lifetimes follow it, so
        a test can pass one it advances by hand (latency stays real time)."""
        path = Path(log_path) if log_path is not None else None
        self._app = App(config, path, keep_requests=keep_requests, clock=clock)
        self._host = host
        self._port = port
        self._bound_port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # -- properties ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The listening port (the configured one until started)."""
        return self._bound_port if self._bound_port is not None else self._port

    @property
    def url(self) -> str:
        """The ``base_url`` for ``openai.AsyncOpenAI``: ``http://HOST:PORT/v1``."""
        return f"{self.anthropic_url}/v1"

    @property
    def anthropic_url(self) -> str:
        """The ``base_url`` for ``anthropic.AsyncAnthropic``: ``http://HOST:PORT``."""
        if self._bound_port is None and self._port == 0:
            raise RuntimeError("the simulator is not listening yet; call start() first")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    @property
    def config(self) -> SimConfig:
        """The configuration in force."""
        return self._app.config

    @property
    def requests(self) -> list[RequestLog]:
        """A snapshot of the model calls so far (chat completions and messages): real-time
        requests and batch lines."""
        return self._app.logger.entries()

    @property
    def batches(self) -> list[dict[str, Any]]:
        """A snapshot of every Batch API batch created, as the API shows it, oldest first."""
        return self._app.batches.objects()

    @property
    def message_batches(self) -> list[dict[str, Any]]:
        """A snapshot of every Message Batch not deleted, as the API shows it, oldest first."""
        return self._app.anthropic.batches.objects(self.anthropic_url, self._app.clock())

    @property
    def files(self) -> list[dict[str, Any]]:
        """A snapshot of every file held (uploaded or made by a batch), as the API shows it."""
        return self._app.files.objects()

    @property
    def bill(self) -> Bill:
        """The server's own bill: what each answer cost at the configured prices and tier."""
        return self._app.engine.bill

    @property
    def cache(self) -> PrefixCache:
        """OpenAI's prefix cache (``clear()`` it to start cold)."""
        return self._app.engine.cache

    @property
    def anthropic_cache(self) -> BreakpointCache:
        """Anthropic's prompt cache (``clear()`` it to start cold)."""
        return self._app.anthropic.messages.cache

    @property
    def uptime_s(self) -> float:
        """Seconds since the server started listening (the clock of ``outages`` and ``t``)."""
        return self._app.clock() - self._app.t0

    def completed_bodies(self) -> list[dict[str, Any]]:
        """Request bodies of the completions that got a full, usable 200 answer."""
        return [r.body for r in self._app.logger.entries() if r.completed]

    def set_config(self, config: SimConfig) -> None:
        """Swap the configuration; the next request sees it (rate buckets reset if changed)."""
        self._app.config = config

    # -- lifecycle -------------------------------------------------------------------------

    async def _serve(self, on_ready: Callable[[], None], *, handle_signals: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop_event = stop = asyncio.Event()
        app = self._app
        http = HttpServer(app)
        wake = asyncio.Event()
        app.wake = wake.set
        server = await loop.create_server(
            http.protocol, self._host, self._port, backlog=BACKLOG, reuse_address=True
        )
        driver = asyncio.create_task(_drive_batches(app, wake))
        try:
            self._bound_port = int(server.sockets[0].getsockname()[1])
            app.open()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, stop.set)
            on_ready()
            await stop.wait()
        finally:
            driver.cancel()
            http.abort_all()
            server.close()
            # Connections accepted but not yet set up are finished by asyncio tasks; let them
            # run (connection_made aborts them now that the server is closing).
            current = asyncio.current_task()
            others = [t for t in asyncio.all_tasks() if t is not current]
            if others:
                await asyncio.wait(others, timeout=2.0)
            for _ in range(3):
                await asyncio.sleep(0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2.0)
            app.close()

    def start(self) -> Simulator:
        """Listen on a background thread with its own event loop; return once listening."""
        if self._thread is not None:
            raise RuntimeError("simulator already started")
        _raise_nofile_limit()
        self._ready.clear()
        self._error = None

        def run() -> None:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self._serve(self._ready.set))
            except BaseException as exc:
                self._error = exc
            finally:
                try:
                    loop.run_until_complete(loop.shutdown_asyncgens())
                finally:
                    loop.close()
                    self._ready.set()

        self._thread = threading.Thread(target=run, name="api-simulator", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            self._thread = None
            raise RuntimeError(f"simulator failed to start: {self._error!r}") from self._error
        return self

    def stop(self) -> None:
        """Close the listener and every connection, then join the server thread."""
        thread, loop, stop = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
        self._thread = None
        self._loop = None
        self._stop_event = None

    def serve_forever(self, announce: Callable[[str], None] | None = None) -> None:
        """Serve on the calling thread until SIGTERM/SIGINT (used by the CLI)."""
        _raise_nofile_limit()

        def ready() -> None:
            if announce is not None:
                announce(self.url)

        asyncio.run(self._serve(ready, handle_signals=True))

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
