"""The code-with-tests kit: what jobs whose answers are programs with their tests share.

::

    program      code and its tests as one program: reading it out of a reply, splitting it
    checks       running the request's examples and the answer's tests; metrics and findings
    select       the opt-in ``pooled`` selection rule, as a chain of named filters
    answer_kind  ``CodeWithTests``, the ``AnswerKind`` a job's hooks expose as ``KIND``

Runs code only through ``pipeline.sandbox``; the engine (``pipeline.core``) knows none of it.
"""

from jobs.code.answer_kind import CodeWithTests
from jobs.code.checks import Checked, check_answer, findings, metrics, stated_examples
from jobs.code.program import TESTS_MARKER, code_with_tests, join, split, split_tests
from jobs.code.select import FILTERS, Pooled

__all__ = [
    "FILTERS",
    "TESTS_MARKER",
    "Checked",
    "CodeWithTests",
    "Pooled",
    "check_answer",
    "code_with_tests",
    "findings",
    "join",
    "metrics",
    "split",
    "split_tests",
    "stated_examples",
]
