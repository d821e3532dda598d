"""The worker pool: up to ``concurrency`` records in flight, fed through a bounded stream."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream

__all__ = ["run_pool"]

T = TypeVar("T")


async def run_pool(
    produce: Callable[[ObjectSendStream[T]], Awaitable[None]],
    work: Callable[[T], Awaitable[None]],
    concurrency: int,
) -> None:
    """Run ``produce`` into a stream drained by ``concurrency`` workers calling ``work``.

    The stream holds at most ``concurrency`` items, so a slow pool holds back the
    producer and memory stays bounded whatever the input size.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    send, receive = anyio.create_memory_object_stream[T](concurrency)

    async def producer() -> None:
        async with send:
            try:
                await produce(send)
            except anyio.BrokenResourceError:
                # Every worker is gone: one failed and the group is being cancelled.
                # Its error is the one to report, not this consequence.
                return

    async def worker(items: ObjectReceiveStream[T]) -> None:
        async with items:
            async for item in items:
                await work(item)

    async with anyio.create_task_group() as tg:
        tg.start_soon(producer)
        for _ in range(concurrency):
            tg.start_soon(worker, receive.clone())
        receive.close()
