"""Kinds of answer: what the loop asks of a job's answers, as a protocol jobs plug into.

The loop knows no particular job. What differs between kinds of answer (prose, a program,
a program with its tests) is behind ``AnswerKind``: taking the artifact out of a reply,
making an answer cut off at max_tokens fit to check, showing it in the conversation,
splitting it for the output line, ranking answers by what their checks found, and the
opt-in selection rules (``Selection``) that choose a record's output some other way than
the default rule. ``text`` and ``code`` are built in; a job's hooks file may define
``KIND``, an object of its own (the code-with-tests kit under ``jobs/code`` is one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .extraction import extract_code, extract_text
from .steps import Step

__all__ = [
    "BUILTIN_ANSWER_KINDS",
    "AnswerKind",
    "Code",
    "Selection",
    "Text",
    "check_rank",
]


class Selection(Protocol):
    """An opt-in rule that chooses a record's output among all its drafts.

    ``measure`` runs (in a worker thread) after each draft, on the record's fields and the
    outputs of every draft so far, oldest first; what it returns is kept in the new draft's
    metrics under the rule's ``name``, so ``choose`` reads it from the trace and a resumed
    record needs no rerun. ``choose`` returns the index of the chosen draft.
    """

    @property
    def name(self) -> str: ...

    def measure(self, fields: Mapping[str, Any], outputs: Sequence[str]) -> dict[str, Any] | None:
        """Evidence for ``choose`` about every draft so far, or None."""
        ...

    def choose(self, drafts: Sequence[Step], scores: Sequence[float | None]) -> int:
        """The index of the chosen draft; ``scores`` are the critic's (None: no feedback)."""
        ...


class AnswerKind(Protocol):
    """What the loop needs of a kind of answer."""

    @property
    def name(self) -> str: ...

    @property
    def selections(self) -> Mapping[str, Selection]:
        """The opt-in selection rules this answer kind offers, by name."""
        ...

    def extract(self, text: str) -> str:
        """The answer in a model's reply (the reply less preamble, fences and notes)."""
        ...

    def cut(self, output: str) -> str:
        """An answer cut off at max_tokens inside its artifact, made fit to check."""
        ...

    def shown(self, output: str) -> str:
        """The answer as the record's conversation shows it to the model."""
        ...

    def parts(self, output: str) -> tuple[str, str | None]:
        """The answer for the output line, and the tests it carries (None: no tests)."""
        ...

    def rank(self, step: Step) -> tuple[float, ...]:
        """How the job's checks rank an answer (higher is better), reading no label."""
        ...


def check_rank(step: Step) -> tuple[float, ...]:
    """Answers passing their checks first, then those with fewer findings; an answer that
    was not checked ranks with the passing ones (nothing says it is worse)."""
    found = step.checks
    if found is None:
        return (1.0, 0.0)
    return (float(not found), -float(len(found)))


class Text:
    """Prose: the reply less its preamble, label and wrapping quotes."""

    name = "text"
    selections: Mapping[str, Selection] = {}

    def extract(self, text: str) -> str:
        """See ``AnswerKind``."""
        return extract_text(text)

    def cut(self, output: str) -> str:
        """See ``AnswerKind``."""
        return output

    def shown(self, output: str) -> str:
        """See ``AnswerKind``."""
        return output

    def parts(self, output: str) -> tuple[str, str | None]:
        """See ``AnswerKind``."""
        return output, None

    def rank(self, step: Step) -> tuple[float, ...]:
        """See ``AnswerKind``."""
        return check_rank(step)


class Code(Text):
    """A program: the first Python block of the reply."""

    name = "code"

    def extract(self, text: str) -> str:
        """See ``AnswerKind``."""
        return extract_code(text)

    def shown(self, output: str) -> str:
        """See ``AnswerKind``."""
        return f"```python\n{output}\n```"


BUILTIN_ANSWER_KINDS: Mapping[str, AnswerKind] = {"text": Text(), "code": Code()}
