"""``refine cancel RUN_DIR``: cancel a run's batches in flight; its records stay resumable.

Cancelling takes the run lock, so it never races a run that is sending batches: stop a
waiting run first (SIGINT or SIGTERM leave its batches running). A batch created by a run
killed before it recorded the id is found by its token and cancelled too; an intent that
never became a batch has its uploaded input file deleted (found by its name when its id was
never recorded) and is forgotten, so nothing is left on the provider. The next ``refine
run`` collects the lines the cancelled batches finished and sends the rest again.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import anyio

from ..backends.batch import (
    BatchAPI,
    BatchInfo,
    Entry,
    Ledger,
    Sides,
    find_by_token,
    find_upload,
    input_file_name,
    open_sides,
)
from ..backends.batch.opening import OpenedAPI
from ..errors import CallError, FatalCallError, RunLocked
from ..runs.rundir import RunDir
from ..runs.settings import DEFAULT_TIMEOUT_S, cache_ttl_of
from ..runs.urls import provider_of, run_urls

__all__ = ["acancel", "cancel"]

log = logging.getLogger("refine")


async def acancel(
    run_dir: str | Path, *, api_key: str | None = None, api: BatchAPI | None = None
) -> list[BatchInfo]:
    """Cancel the batches of the run in ``run_dir`` that are in flight; what the API says of each.

    ``api`` replaces the Batch API opened at the run's endpoints (a test's fake), for both
    sides; it is not closed here.
    """
    rd = RunDir(Path(run_dir))
    manifest = rd.require_manifest()
    settings = manifest.settings
    if api_key is None:
        api_key = os.environ.get(provider_of(settings).key_env or "OPENAI_API_KEY")
    with _locked(rd):
        ledger = Ledger(rd.batches_path, fsync=settings.fsync, warn=log.warning)
        opened: list[OpenedAPI] = []
        if api is not None:
            sides = Sides.over(api, manifest.model, manifest.feedback_model)
        else:
            urls = run_urls(manifest)
            url = urls[0] if urls else None
            critic = None
            if manifest.feedback_model is not None:
                critic = (manifest.feedback_model, settings.feedback_base_url or url)
            timeout = settings.timeout or DEFAULT_TIMEOUT_S
            generator = (manifest.model, url)
            ttl = cache_ttl_of(settings)
            sides, opened = open_sides(api_key, timeout, generator, critic, ttl)
        try:
            return await _cancel_all(ledger, sides)
        finally:
            ledger.close()
            with anyio.CancelScope(shield=True):
                for each in opened:
                    await each.aclose()


@contextlib.contextmanager
def _locked(rd: RunDir) -> Iterator[None]:
    """The run lock, refused with a hint while a run holds it."""
    try:
        with rd.lock():
            yield
    except RunLocked as err:
        raise RunLocked(
            f"{err}; stop that run first (SIGINT or SIGTERM leave its batches running), then cancel"
        ) from err


async def _cancel_all(ledger: Ledger, sides: Sides) -> list[BatchInfo]:
    cancelled: list[BatchInfo] = []
    entries = [e for e in ledger.state.entries.values() if not e.collected]
    for entry in entries:
        api = sides.named(entry.side).api
        if entry.batch_id is None:
            info = (await find_by_token(api, {entry.token}, entry.at)).get(entry.token)
            if info is None:
                await _discard(ledger, api, entry)  # never created: nothing runs
                continue
            ledger.created(entry.token, info.id)
        assert entry.batch_id is not None
        try:
            info = await api.cancel(entry.batch_id)
        except CallError as err:
            if err.status != 409:  # 409: it ended already
                raise
            info = await api.retrieve(entry.batch_id)
        ledger.cancel(entry.token)
        cancelled.append(info)
    return cancelled


async def _discard(ledger: Ledger, api: BatchAPI, entry: Entry) -> None:
    """Delete the input file of an intent that never became a batch, and forget the intent.

    A file that cannot be deleted now leaves the intent open: the next run deletes it.
    """
    name = input_file_name(entry.token)
    try:
        if entry.file_id is None:
            for file_id in await find_upload(api, name, entry.at):
                log.warning("file %s was uploaded but never used; it is deleted", file_id)
                ledger.uploaded(entry.token, file_id)
        for file_id in entry.files:
            await api.delete(file_id)
    except CallError as err:
        if isinstance(err, FatalCallError):
            raise
        log.warning("the input file %s is left for the next run to delete (%s)", name, err)
        return
    ledger.closed(entry.token, "never created")


def cancel(
    run_dir: str | Path, *, api_key: str | None = None, api: BatchAPI | None = None
) -> list[BatchInfo]:
    """Cancel the run's batches in flight; see ``acancel``."""
    return anyio.run(lambda: acancel(run_dir, api_key=api_key, api=api))
