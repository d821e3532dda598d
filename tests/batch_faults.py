"""A `refine run --batch` that dies (SIGKILL) at one moment of a batch's life, for crash tests.

``python -m tests.batch_faults POINT ARGS...`` runs ``refine ARGS...`` (a ``run --batch``
command line) through the library, with a Batch API backend over ``Dying``: the model's
batch API at the run's URL (OpenAI's, or Anthropic's Message Batches for an anthropic:
model), wrapped to kill the process at POINT, as a power cut would:

    after_upload       the input file is uploaded; its id is not yet in the ledger
    before_create      the file's id is in the ledger; the batch is not yet created
    after_create       the batch exists; its id is not yet in the ledger
    before_collected   the batch's lines are in the journal; the ledger does not yet say
                       it was collected (no request lies between: the ledger's write is
                       where it dies)

The production code has no crash point: the process dies here, in the test's fake.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from unittest import mock

from pipeline import run
from pipeline.backends.batch import BatchAPI, BatchBackend, BatchInfo, Ledger
from pipeline.backends.batch.api import FileInfo
from pipeline.backends.batch.opening import BATCH_APIS
from pipeline.cli.parser import build_parser, settings_from_args
from pipeline.client.models import ModelId
from pipeline.runs.settings import cache_ttl_of

POINTS = ("after_upload", "before_create", "after_create", "before_collected")


def die() -> None:
    """End the process at once, as SIGKILL does: no cleanup, no flush."""
    os.kill(os.getpid(), signal.SIGKILL)


class Dying:
    """A Batch API that passes every request on to ``api`` and dies at ``point``."""

    def __init__(self, api: BatchAPI, point: str) -> None:
        self.api = api
        self.point = point

    async def upload(self, name: str, data: bytes) -> str:
        file_id = await self.api.upload(name, data)
        if self.point == "after_upload":
            die()
        return file_id

    async def create(self, file_id: str, metadata: Mapping[str, str]) -> BatchInfo:
        if self.point == "before_create":
            die()
        info = await self.api.create(file_id, metadata)
        if self.point == "after_create":
            die()
        return info

    async def retrieve(self, batch_id: str) -> BatchInfo:
        return await self.api.retrieve(batch_id)

    def listing(self) -> AsyncIterator[BatchInfo]:
        return self.api.listing()

    def file_listing(self) -> AsyncIterator[FileInfo]:
        return self.api.file_listing()

    async def cancel(self, batch_id: str) -> BatchInfo:
        return await self.api.cancel(batch_id)

    async def content(self, file_id: str) -> bytes:
        return await self.api.content(file_id)

    async def delete(self, file_id: str) -> None:
        await self.api.delete(file_id)

    async def aclose(self) -> None:
        await self.api.aclose()


def main(argv: Sequence[str]) -> int:
    """Run ``refine ARGV[1:]`` with --batch over ``Dying(ARGV[0])``; its exit status."""
    point, *refine = argv
    if point not in POINTS:
        raise SystemExit(f"batch_faults: POINT must be one of {', '.join(POINTS)}")
    args = build_parser().parse_args(refine)
    settings = settings_from_args(args)
    (url,) = settings.base_urls()
    provider = ModelId.parse(settings.model).provider
    key = os.environ.get(provider.key_env or "OPENAI_API_KEY")
    api = Dying(BATCH_APIS[provider](url, key, 60.0, cache_ttl_of(settings)), point)
    dying_ledger = mock.patch.object(Ledger, "collected", lambda *_, **__: die())
    with dying_ledger if point == "before_collected" else contextlib.nullcontext():
        summary = run(
            args.job, args.input, args.out, settings, backend=BatchBackend(api), show_progress=False
        )
    return summary.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
