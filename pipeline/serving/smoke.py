"""Checks an install of the local extra: the server loads a model and answers one request.

``python -m pipeline.serving.smoke [MODEL]`` (``scripts/install local`` runs it
after installing a build): resolves the model (the default one unless named; fetched
once), starts ``llama-server`` with one slot, asks one short question and prints how long
each part took. Exit 0 when the server answered; 2, with a message that says what to do,
when it did not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from ..errors import LocalModelError, ServerStartError
from .cpu import crash_advice
from .registry import LocalModel
from .resolve import resolve_model
from .server import LocalServer

__all__ = ["QUESTION", "Smoke", "completion", "main", "smoke"]

QUESTION = "Reply with one word: ready."
MAX_TOKENS = 8


@dataclass(frozen=True, slots=True)
class Smoke:
    """What one check found: the server, how long it took to load and to answer, the answer."""

    model: str
    binary: Path
    load_s: float
    answer_s: float
    answer: str
    completion_tokens: int

    def summary(self) -> str:
        """One line for the install's output."""
        return (
            f"llama-server answered: {self.model} loaded in {self.load_s:.1f} s, "
            f"{self.completion_tokens} tokens ({self.answer.strip()[:40]!r}) in "
            f"{self.answer_s:.1f} s ({self.binary})"
        )


def _ask(base_url: str, model: str, timeout: float) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        reply: dict[str, Any] = json.load(answer)
        return reply


def completion(reply: dict[str, Any]) -> tuple[str, int]:
    """The answer's text and completion tokens; ValueError when the reply holds none."""
    try:
        text = reply["choices"][0]["message"]["content"]
        tokens = reply["usage"]["completion_tokens"]
    except (KeyError, IndexError, TypeError) as err:
        raise ValueError(f"not a chat completion: {json.dumps(reply)[:300]}") from err
    if not isinstance(text, str) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"no answer in {json.dumps(reply)[:300]}")
    return text, tokens


async def smoke(
    model: LocalModel,
    *,
    program: Sequence[str] | None = None,
    timeout: float = 300.0,
    clock: Callable[[], float] = time.monotonic,
) -> Smoke:
    """Start the server on ``model``, ask :data:`QUESTION`, stop it; ServerStartError if not."""
    server = LocalServer(model, parallel=1, program=program)
    started = clock()
    async with server:
        loaded = clock()
        try:
            reply = await anyio.to_thread.run_sync(_ask, server.base_url, server.model, timeout)
            text, tokens = completion(reply)
        except (OSError, ValueError) as err:
            # The server may have died answering: how it ended says more than the socket.
            await server.stop(keep_log=True)
            ended = server.returncode
            advice = crash_advice(ended, server.binary, server.build) if ended is not None else ""
            raise ServerStartError(
                f"the llama.cpp server started but did not answer ({err}); it ended with code "
                f"{ended} (log: {server.log_path}):\n{server.log_tail()}"
                + (f"\n{advice}" if advice else "")
            ) from err
        answered = clock()
    return Smoke(model.name, server.binary, loaded - started, answered - loaded, text, tokens)


def main(argv: Sequence[str] | None = None) -> int:
    """Check the installed server on a model; print the result; 0 if it answered, else 2."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.serving.smoke",
        description="Start llama-server on a local model, ask one short question, stop it.",
    )
    parser.add_argument(
        "model", nargs="?", default=None, help="a local model, as --local-model takes it"
    )
    args = parser.parse_args(argv)
    try:
        model = resolve_model(args.model)
        result = anyio.run(smoke, model)
    except LocalModelError as err:
        print(f"refine: {err}", file=sys.stderr)
        return 2
    print(result.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
