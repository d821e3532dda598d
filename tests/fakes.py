"""One scripted model client and one recording sink, shared by the loop, check and runner tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from pipeline.core.steps import Completion, ModelClient, Request, Step


class RecordingSink:
    """Keeps every saved step with its record id and index."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, int, Step]] = []

    @property
    def steps(self) -> list[Step]:
        """The saved steps, in order."""
        return [s for _, _, s in self.saved]

    async def save(self, record_id: str, earlier: Sequence[Step], step: Step) -> None:
        self.saved.append((record_id, len(earlier), step))


class ScriptedClient(ModelClient):  # the protocol named, so mypy holds it to it
    """Answers from a script (a text, a Completion or an exception to raise); records each call.

    With ``gate=n`` every call waits until ``n`` calls are in flight at once (to show how
    many loops a run keeps going); with ``sink`` it notes how many steps were saved when
    each call was made (to show a step is saved before the next call).
    """

    def __init__(
        self,
        script: Sequence[str | Completion | BaseException] = (),
        *,
        model: str = "fake-model",
        default: str | None = None,
        sink: RecordingSink | None = None,
        gate: int | None = None,
        usage: tuple[int, int] = (100, 20),
    ) -> None:
        self.script = list(script)
        self._model = model
        self.default = default  # answer when the script has run out (None: that is a bug)
        self.sink = sink
        self.usage = usage
        self.requests: list[Request] = []
        self.saved_at_call: list[int] = []
        self.gate = gate
        self.in_flight = 0
        self.peak = 0
        self._released: anyio.Event | None = None

    @property
    def model(self) -> str:
        return self._model

    @property
    def messages(self) -> list[list[dict[str, str]]]:
        """The messages of every call, in order, as a step records them."""
        return [[dict(m) for m in r.messages] for r in self.requests]

    @property
    def schemas(self) -> list[Mapping[str, Any] | None]:
        """The schema of every call, in order."""
        return [r.schema for r in self.requests]

    @property
    def temperatures(self) -> list[float]:
        """The temperature of every call, in order."""
        return [r.temperature for r in self.requests]

    @property
    def penalties(self) -> list[float | None]:
        """The frequency penalty of every call, in order."""
        return [r.frequency_penalty for r in self.requests]

    @property
    def cache_keys(self) -> list[str | None]:
        """The cache key of every call, in order."""
        return [r.cache_key for r in self.requests]

    @property
    def calls(self) -> list[tuple[list[dict[str, str]], float]]:
        """(messages, temperature) of every call, in order."""
        return list(zip(self.messages, self.temperatures, strict=True))

    async def complete(self, request: Request) -> Completion:
        self.requests.append(request)
        if self.sink is not None:
            self.saved_at_call.append(len(self.sink.saved))
        if self.gate is not None:
            await self._wait_for_gate()
        if self.script:
            item = self.script.pop(0)
        else:
            assert self.default is not None, "the loop made more calls than scripted"
            item = self.default
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Completion):
            return item
        return Completion(
            text=item,
            prompt_tokens=self.usage[0],
            completion_tokens=self.usage[1],
            latency_s=0.5,
            attempts=1,
            model=self._model,
        )

    async def _wait_for_gate(self) -> None:
        assert self.gate is not None
        if self._released is None:
            self._released = anyio.Event()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.in_flight >= self.gate:
            self._released.set()
        with anyio.fail_after(20):
            await self._released.wait()
        self.in_flight -= 1
