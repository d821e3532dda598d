"""Running a program's tests, or calls of its functions, in the sandbox: what each gave."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from .harness import CALLS_HARNESS, MARK, TEST_HARNESS
from .policy import SandboxPolicy
from .process import MAX_DRAIN_BYTES, run_python

__all__ = [
    "TESTS_MEMORY_MB",
    "TESTS_PER_TEST_S",
    "TESTS_TIMEOUT_S",
    "TestsRun",
    "run_calls",
    "run_tests",
]


@dataclass(frozen=True, slots=True)
class TestsRun:
    """What running a program's tests found: one result per test, None when it passed.

    ``error`` is set when the program itself failed before its tests could run; then
    ``results`` is empty.
    """

    results: tuple[str | None, ...]
    error: str | None = None

    @property
    def passed(self) -> int:
        """How many tests passed."""
        return sum(r is None for r in self.results)


# The limits an answer's tests run under, by its job's check and by the loop's pooled tests
# alike (one home: an answer must fare the same on the same test in both).
TESTS_TIMEOUT_S = 10.0
TESTS_PER_TEST_S = 2.0
TESTS_MEMORY_MB = 512


def run_tests(
    code: str,
    tests: Sequence[str],
    *,
    timeout_s: float = TESTS_TIMEOUT_S,
    per_test_s: float = TESTS_PER_TEST_S,
    memory_mb: int = TESTS_MEMORY_MB,
    policy: SandboxPolicy | None = None,
) -> TestsRun:
    """Run ``code``, then each test (Python source) in its namespace, each one on its own.

    A failing assert, an exception and a test running past ``per_test_s`` each fail that
    test only; a failed ``assert a == b`` says what ``a`` was and, where ``a`` called the
    code, where that call returned and the code's own values there (its locals but the
    parameters, briefly); an exception raised in the code says where, with the values
    there. ``policy`` as for ``run_python``. Never raises for anything the program or its
    tests do.
    """
    call = f"exec({TEST_HARNESS!r}) or __refine_tests__({list(tests)!r}, {per_test_s!r})"
    # Each test's result comes on standard error, after whatever the program writes there:
    # all of it is read (the run is killed past MAX_DRAIN_BYTES), so that a program
    # writing much there, or many failing tests, cannot push the later results out.
    run = run_python(
        code,
        call=call,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        stderr_bytes=MAX_DRAIN_BYTES,
        policy=policy,
    )
    reported: list[str | None] = []
    started = False
    for line in run.stderr.split("\n"):  # not splitlines(): it splits at \x1e too
        if not line.startswith(MARK):
            continue
        try:
            message = orjson.loads(line[len(MARK) :])
        except orjson.JSONDecodeError:
            continue
        if message == "start" and not started:
            started = True
        elif started and (message is None or isinstance(message, str)):
            reported.append(message)
    if not started:
        return TestsRun((), run.error or "the tests did not run")
    if len(reported) < len(tests):  # a test stopped the whole run: the deadline, a limit
        reported.append(f"stopped the run: {run.error or 'no result'}")
        reported += ["not run: an earlier test stopped the run"] * (len(tests) - len(reported))
    return TestsRun(tuple(reported[: len(tests)]))


def run_calls(
    code: str,
    calls: Sequence[str],
    *,
    timeout_s: float = TESTS_TIMEOUT_S,
    per_call_s: float = 0.5,
    memory_mb: int = TESTS_MEMORY_MB,
    policy: SandboxPolicy | None = None,
) -> tuple[str, ...] | None:
    """Run ``code``, then evaluate each call expression in its namespace: what each gave,
    as text (its repr, followed by `` [argument 1 changed]`` when the call changed a
    positional argument's value, ``raises ValueError``, ``raises RomanError(ValueError)`` for an
    error class of the code's own with its built-in base, ``timeout``). None when the program failed
    before the calls ran or the run as a whole did not finish. ``policy`` as for
    ``run_python``. Never raises for anything the program does.
    """
    if not calls:
        return ()
    call = f"exec({CALLS_HARNESS!r}) or __refine_calls__({list(calls)!r}, {per_call_s!r})"
    run = run_python(code, call=call, timeout_s=timeout_s, memory_mb=memory_mb, policy=policy)
    if run.value is None:
        return None
    try:
        value = orjson.loads(run.value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, list) or len(value) != len(calls):
        return None
    return tuple(str(v) for v in value)
