"""Serving the embedded model for a run: start llama.cpp's server, yield its endpoint."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from ..client.models import ModelId
from ..runs.clients import Endpoint
from .binary import check_cpu, check_llama_cpp
from .resolve import resolve_model
from .server import LocalServer, slots_for

__all__ = ["serve"]


@contextlib.asynccontextmanager
async def serve(name: str | None, run_dir: Path, concurrency: int) -> AsyncIterator[Endpoint]:
    """Start llama.cpp's server for a local model; its errors are ConfigErrors (exit 2)."""
    # Before downloading hundreds of MB, not after: the server is there and runs here.
    await anyio.to_thread.run_sync(check_cpu, check_llama_cpp())
    # Resolving may download and hash the model: keep the event loop free.
    model = await anyio.to_thread.run_sync(resolve_model, name)
    server = LocalServer(model, log_dir=run_dir, parallel=slots_for(concurrency))
    await server.__aenter__()
    try:
        yield Endpoint(
            server.model,
            ModelId.local(server.model),
            (server.base_url,),
            server.structured,
            server.parallel,
            model.provenance(),
            server.grammar,
            server.slot_ctx,
        )
    finally:
        with anyio.CancelScope(shield=True):
            await server.__aexit__(None, None, None)
