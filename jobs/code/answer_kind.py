"""The code-with-tests kind of answer: a program that carries its own tests."""

from __future__ import annotations

from collections.abc import Mapping

from jobs.code.checks import TESTS_PASSED, TESTS_TOTAL
from jobs.code.program import code_with_tests, split, without_unfinished_test
from jobs.code.select import Pooled
from pipeline.core.answer_kinds import Selection, Text, check_rank
from pipeline.core.steps import Step

__all__ = ["CodeWithTests"]


class CodeWithTests(Text):
    """Code and its tests as one program (``program``), shown to the model as such.

    Drafts rank by their checks, then by how many of their own tests pass; the kind offers
    the ``pooled`` selection rule (``select``).
    """

    name = "code-with-tests"
    selections: Mapping[str, Selection] = {"pooled": Pooled()}

    def extract(self, text: str) -> str:
        """See ``AnswerKind``."""
        return code_with_tests(text)

    def cut(self, output: str) -> str:
        """An answer cut off inside its tests, less the test the limit stopped mid-line."""
        return without_unfinished_test(output)

    def shown(self, output: str) -> str:
        """See ``AnswerKind``."""
        return f"```python\n{output}\n```"

    def parts(self, output: str) -> tuple[str, str | None]:
        """The code, and its tests."""
        return split(output)

    def rank(self, step: Step) -> tuple[float, ...]:
        """Checks first, then the share of its own tests that pass."""
        metrics = step.metrics or {}
        total, passed = metrics.get(TESTS_TOTAL), metrics.get(TESTS_PASSED)
        share = (
            passed / total if isinstance(total, int) and isinstance(passed, int) and total else 0.0
        )
        return (*check_rank(step), share)
