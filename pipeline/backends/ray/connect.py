"""Reaching Ray: join a cluster (``--ray-address`` or ``$RAY_ADDRESS``), or start a local one.

A local instance is started for the run and stopped after it, sized to hold the workers
(one CPU each) with a small object store (only small messages travel). A program that
started Ray itself keeps it: the run uses it and leaves it running.

Ray ties the processes it starts to the *thread* that started them (``prctl`` with
``PR_SET_PDEATHSIG``): started from a pool thread that later goes idle and ends, the local
instance dies with it mid-run. So Ray is started, and stopped, by a thread of its own that
lives as long as the run; on the event loop's thread it would also block the loop for
seconds and install a SIGTERM handler over the CLI's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio

from ...errors import ConfigError
from ...runs.settings import Settings

__all__ = ["LOCAL_STORE_BYTES", "connect", "require_ray"]

LOCAL_STORE_BYTES = 128 * 1024 * 1024


def require_ray() -> None:
    """Raise ConfigError, saying how to install it, when Ray is missing."""
    try:
        import ray  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            "--workers runs on Ray, which is not installed: pip install 'refine[ray]' "
            "(on the driver and on every node of the cluster)"
        ) from err


def init_options(settings: Settings, workers: int) -> dict[str, Any]:
    """The arguments of ``ray.init`` for this run."""
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    address = settings.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        options["address"] = address
    else:
        options.update(
            num_cpus=max(os.cpu_count() or 1, workers),
            include_dashboard=False,
            object_store_memory=LOCAL_STORE_BYTES,
        )
    return options


class _Host:
    """The thread that starts Ray, stays while the run goes on, and shuts Ray down."""

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options
        self._ready = threading.Event()
        self._done = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._host, name="refine-ray", daemon=True)

    def _host(self) -> None:
        import ray

        try:
            ray.init(**self._options)
        except BaseException as err:  # handed to the event loop's thread by ``start``
            self.error = err
            return
        finally:
            self._ready.set()
        self._done.wait()
        ray.shutdown()

    async def start(self) -> None:
        """Start (or join) Ray; raise what ``ray.init`` raised."""
        self._thread.start()
        await anyio.to_thread.run_sync(self._ready.wait)
        if self.error is not None:
            raise self.error

    async def stop(self) -> None:
        """Shut Ray down (a local instance stops; a joined cluster is left)."""
        self._done.set()
        await anyio.to_thread.run_sync(self._thread.join)


@contextlib.asynccontextmanager
async def connect(settings: Settings, workers: int) -> AsyncIterator[None]:
    """Ray, ready for the run's actors, for the duration of the block."""
    require_ray()
    import ray

    if ray.is_initialized():
        yield
        return
    options = init_options(settings, workers)
    where = f"join the Ray cluster at {options['address']}" if "address" in options else "start Ray"
    host = _Host(options)
    try:
        await host.start()
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ConfigError(f"cannot {where}: {err}") from err
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await host.stop()
