"""A model that knows some answers: programs for known questions, right at a rate you set.

Given question -> answer pairs (records shaped as gsm's: ``input`` the question, ``target``
the number), the simulator answers a text request whose first user message holds a known
question with a program-aided solution: ``def solution(): return N``. N is the right
answer with probability ``p_right`` on a first draft (a request that carries no earlier
answer) and ``p_right_refined`` on a refinement (one that does), else a wrong number. So a
run against it can be made to gain from refinement (``p_right_refined > p_right``) or lose
by it, which is what ``refine calibrate`` has to tell apart.

Each reply is decided by a draw from the seed and the request. At temperature 0 the same
request always gets the same reply; above it (best-of-n's samples are the same messages at
a higher temperature) the n-th time a request is asked draws afresh, as a sampling model
would. The answers stay with the simulator: the pipeline never sends a label, the model
simply knows the answers, as a strong model knows a benchmark's.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from .content import fenced_schema

__all__ = ["AnswerKey", "KnownAnswers", "parse_number", "program"]

_JUNK: Final = re.compile(r"[,\s$]")


def parse_number(value: Any) -> float | None:
    """A reference answer as a number: 18, "18", "1,200", "$5", "... #### 18"; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        return None
    text = _JUNK.sub("", value.rsplit("####", 1)[-1])
    try:
        return float(text)
    except ValueError:
        return None


def program(number: float) -> str:
    """A gsm-style answer: a fenced program whose ``solution()`` returns ``number``."""
    shown = str(int(number)) if number.is_integer() else repr(number)
    return f"```python\ndef solution():\n    return {shown}\n```"


def _pair(rec: Any, question: str, answer: str) -> tuple[str, float]:
    """A record's question and its number; ValueError saying what is missing."""
    if not isinstance(rec, Mapping):
        raise ValueError("not a JSON object")
    text, number = rec.get(question), parse_number(rec.get(answer))
    if not isinstance(text, str) or not text.strip() or number is None:
        raise ValueError(
            f"needs a {question!r} text and a numeric {answer!r} (got {rec.get(answer)!r})"
        )
    return text.strip(), number


@dataclass(frozen=True, slots=True)
class AnswerKey:
    """Known questions and their answers, the longest question first (a question inside
    another never shadows it)."""

    answers: tuple[tuple[str, float], ...]

    @classmethod
    def from_records(
        cls,
        records: Iterable[Mapping[str, Any]],
        question: str = "input",
        answer: str = "target",
    ) -> AnswerKey:
        """From records carrying ``question`` and ``answer`` (a number, or text ending in one)."""
        pairs: dict[str, float] = {}
        for i, rec in enumerate(records, start=1):
            try:
                text, number = _pair(rec, question, answer)
            except ValueError as err:
                raise ValueError(f"record {i}: {err}") from err
            pairs[text] = number
        return cls(tuple(sorted(pairs.items(), key=lambda qa: -len(qa[0]))))

    @classmethod
    def read(cls, path: str | Path) -> AnswerKey:
        """From a JSONL file of gsm-shaped records; ValueError naming the file and line."""
        try:
            lines = Path(path).read_bytes().splitlines()
        except OSError as err:
            raise ValueError(f"{path}: {err.strerror}") from err
        pairs: dict[str, float] = {}
        for lineno, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                text, number = _pair(orjson.loads(raw), "input", "target")
            except (orjson.JSONDecodeError, ValueError) as err:
                raise ValueError(f"{path}:{lineno}: {err}") from err
            pairs[text] = number
        return cls(tuple(sorted(pairs.items(), key=lambda qa: -len(qa[0]))))

    def find(self, text: str) -> float | None:
        """The answer of the known question ``text`` holds, or None."""
        return next((number for question, number in self.answers if question in text), None)


class KnownAnswers:
    """Writes the replies of an answer key, counting repeated samples (thread-safe)."""

    def __init__(self) -> None:
        self._asked: Counter[bytes] = Counter()
        self._lock = threading.Lock()

    def reply(
        self,
        key: AnswerKey,
        messages: Sequence[Mapping[str, Any]],
        texts: Sequence[str],
        *,
        temperature: float | None,
        seed: int,
        p_right: float,
        p_right_refined: float,
    ) -> tuple[str, bytes] | None:
        """The reply to a text request about a known question, and its digest; else None."""
        users = [t for m, t in zip(messages, texts, strict=True) if m.get("role") == "user"]
        if not users or fenced_schema(users[-1]) is not None:
            return None  # a request for structured output (feedback): not an answer
        number = key.find(users[0])
        if number is None:
            return None
        canonical = orjson.dumps(list(messages), option=orjson.OPT_SORT_KEYS)
        nth = 0
        if temperature is None or temperature > 0:  # OpenAI's default temperature is 1
            with self._lock:
                nth = self._asked[canonical]
                self._asked[canonical] += 1
        digest = hashlib.sha256(f"{seed}:answer-key:{nth}:".encode() + canonical).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        refining = any(m.get("role") == "assistant" for m in messages)
        right = draw < (p_right_refined if refining else p_right)
        if not right:  # a wrong number, never the right one
            number += 1 + int.from_bytes(digest[8:10], "big") % 9
        return program(number), digest
