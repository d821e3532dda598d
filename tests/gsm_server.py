"""A GSM-like OpenAI-compatible server: each answer a program, right or wrong at random per call.

Questions follow one pattern (``question``) whose answer the server works out from the
question itself, never from a label. Every answer call draws, from a hash of the seed and
the request's messages (so a call asked again gets the same answer), a program that
returns the right number, a wrong one, or raises; feedback calls say ``done`` now and
then. Answers therefore flip both ways between iterations, as a model's do without an
external signal. Request bodies are kept for the tests (``bodies``).
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.chat_server import serve_chat

_QUESTION = re.compile(r"has (\d+) marbles\. \S+ buys (\d+) more and gives (\d+) away")
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Eli", "Fay", "Gus", "Hana")


def question(i: int) -> tuple[str, int]:
    """The i-th question and its answer."""
    a, b, c = 10 + (7 * i) % 40, 3 + (5 * i) % 17, 1 + (3 * i) % 9
    name = NAMES[i % len(NAMES)]
    text = f"{name} has {a} marbles. {name} buys {b} more and gives {c} away. How many now?"
    return text, a + b - c


def records(n: int, *, labels: bool = True, ids: bool = True) -> list[dict[str, Any]]:
    """``n`` gsm records (``input``, and ``target`` with labels; ``id`` with ids)."""
    out = []
    for i in range(n):
        text, answer = question(i)
        rec: dict[str, Any] = {"id": f"q{i:03d}"} if ids else {}
        rec["input"] = text
        if labels:
            rec["target"] = answer
        out.append(rec)
    return out


def _program(a: int, b: int, c: int, draw: float, p_right: float, p_raise: float) -> str:
    if draw < p_right:
        result = "marbles + bought - given"
    elif draw < p_right + p_raise:
        result = "marbles / 0"
    else:
        result = "marbles + bought + given"
    return (  # the draft number keeps two drafts of one call kind apart (no "no change" stop)
        f"```python\ndef solution():\n    # draft {int(draw * 10_000)}\n"
        f"    marbles = {a}  # at the start\n"
        f"    bought = {b}  # bought\n"
        f"    given = {c}  # given away\n"
        f"    return {result}\n```"
    )


@dataclass
class GsmServer:
    """The server's behaviour; ``serve()`` runs it on a free port."""

    seed: int = 0
    p_right: float = 0.55
    p_right_later: float | None = None  # of refinements (None: p_right)
    p_raise: float = 0.1
    p_done: float = 0.2
    delay_s: float = 0.0  # before each reply (to kill a run mid-way)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def draw(self, body: dict[str, Any], salt: str) -> float:
        """A number in [0, 1) fixed by the seed, the messages and ``salt``."""
        canonical = orjson.dumps(body.get("messages"), option=orjson.OPT_SORT_KEYS)
        digest = hashlib.sha256(f"{self.seed}:{salt}:".encode() + canonical).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def answer(self, body: dict[str, Any]) -> str:
        """The reply's text: feedback JSON for a call asking for a schema, else a program."""
        with self._lock:
            self.bodies.append(body)
        if body.get("response_format") is not None:
            done = self.draw(body, "done") < self.p_done
            actions = [] if done else ["Check the last step: what does the question ask?"]
            return orjson.dumps({"steps": ["ok"], "actions": actions, "done": done}).decode()
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        found = _QUESTION.search(first)
        if found is None:
            return "```python\ndef solution():\n    return 0\n```"
        a, b, c = (int(g) for g in found.groups())
        refining = len(body["messages"]) > 2  # a refinement carries the earlier answers
        p_right = self.p_right if self.p_right_later is None or not refining else self.p_right_later
        return _program(a, b, c, self.draw(body, "answer"), p_right, self.p_raise)

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Run on 127.0.0.1 in a thread; yields the base URL."""

        def answer(body: dict[str, Any]) -> str:
            time.sleep(self.delay_s)
            return self.answer(body)

        with serve_chat(answer) as url:
            yield url
