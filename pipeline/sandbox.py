"""Sandbox: run an untrusted Python program in a limited, short-lived child process.

Job hooks use it to execute model-written programs (program-aided math answers,
optimised code). Each call starts ``python -I -S`` (isolated mode, no site-packages)
in a fresh temporary directory with an empty environment, in a new session so the
whole process group can be killed. Before the program runs, a small bootstrap in
the child

- sets resource limits: address space (``memory_mb``), CPU seconds, file size 0 (no
  file can grow), no core dumps, and no new processes where the kernel enforces that
  (``RLIMIT_NPROC`` is per user and not enforced for root, so it is set only for
  other users, and only in the child, where it cannot starve the user's other work);
- installs an audit hook that refuses network access, starting processes
  (subprocess, ``os.exec*``, ``os.system``, ``os.fork``, ``posix_spawn``), signalling
  other processes, raising resource limits, ``ctypes``, changing the file system and
  opening files for writing.

The limits are set by the bootstrap rather than in ``preexec_fn`` because
``preexec_fn`` is not safe in a threaded parent (hooks run in worker threads), and
the child runs nothing untrusted before the bootstrap has set them. The parent never
lets the child outlive ``timeout_s``: it kills the process group on the deadline.
This guards against mistakes and runaway programs, not against a determined attacker
(it is not a security boundary like a container or seccomp).

Thread-safe: no global state; every call owns its directory, pipes and process.
"""

from __future__ import annotations

import contextlib
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import orjson

from .core.pyast import parse_module

__all__ = [
    "MAX_OUTPUT_BYTES",
    "SandboxResult",
    "TestsRun",
    "run_calls",
    "run_python",
    "run_tests",
    "syntax_problem",
]

MAX_OUTPUT_BYTES: Final = 64 * 1024  # kept of stdout (and of stderr); the rest is dropped
MAX_DRAIN_BYTES: Final = 8 * 1024 * 1024  # a program printing more than this is killed
MAX_ERROR_CHARS: Final = 500
# Of a call's value as JSON, the first this many characters come back: room for every result
# ``run_calls`` gives (at most 300 characters each, for the calls near the tests), which a
# value cut short would lose all at once. The result pipe keeps up to six times as much:
# the value escaped again in the result's JSON (``\uXXXX`` for a character past ASCII).
MAX_VALUE_CHARS: Final = 256 * 1024
_RESULT_BYTES: Final = 6 * MAX_VALUE_CHARS + 64 * 1024
_READ_CHUNK: Final = 65536
_KILL_WAIT_S: Final = 5.0  # a SIGKILLed child is reaped well within this

# Runs in the child, before the program. Kept free of anything that could fail on
# an odd program: it reports every outcome as one JSON object on the result pipe.
_BOOTSTRAP: Final = r"""
import json, os, resource, signal, sys, time, traceback

def _main():
    result_fd, memory, cpu, call = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    for name, soft, hard in (
        ("RLIMIT_AS", memory, memory),
        ("RLIMIT_CPU", cpu, cpu + 1),
        ("RLIMIT_FSIZE", 0, 0),
        ("RLIMIT_CORE", 0, 0),
    ):
        kind = getattr(resource, name)
        ceiling = resource.getrlimit(kind)[1]
        if ceiling != resource.RLIM_INFINITY:  # never ask for more than we may have
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        resource.setrlimit(kind, (soft, hard))
    if os.geteuid() != 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, not kills
    sys.dont_write_bytecode = True
    with open("program.py", encoding="utf-8") as fh:
        source = fh.read()
    sys.argv = ["program.py"]

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    refused_prefixes = (
        "socket.", "ctypes.", "subprocess.", "pty.", "shutil.", "os.exec", "os.spawn",
        "os.posix_spawn", "os.fork", "os.system", "os.startfile", "os.kill",
        "signal.pthread_kill", "resource.setrlimit", "resource.prlimit", "os.remove",
        "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
        "os.link", "os.symlink", "os.utime", "os.mkfifo", "os.mknod", "os.setxattr",
        "os.removexattr",
    )
    refused_modules = {"_posixsubprocess", "_ctypes"}  # direct routes past the events above

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, 0))[:3]
            if isinstance(path, int):  # an fd the process already holds (stdout, a pipe)
                return
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags
            ):
                raise PermissionError(f"sandbox: writing files is not allowed ({path!r})")
        elif event == "import":
            if args and args[0] in refused_modules:
                raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        elif event.startswith(refused_prefixes):
            raise PermissionError(f"sandbox: {event} is not allowed")

    def describe(err):
        line = None
        if isinstance(err, SyntaxError) and err.filename == "<program>":
            line = err.lineno
            text = f"{type(err).__name__}: {err.msg}"
        else:
            for frame in traceback.extract_tb(err.__traceback__):
                if frame.filename == "<program>":
                    line = frame.lineno
            text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        return text + (f" (line {line})" if line else "")

    error = value = cpu = None
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        code = compile(source, "<program>", "exec")
        sys.addaudithook(hook)
        started = time.process_time()
        try:
            exec(code, namespace)
        except SystemExit as err:
            if err.code not in (None, 0):
                error = f"SystemExit: {err.code}"
        cpu = time.process_time() - started
        if error is None and call:
            result = eval(compile(call, "<call>", "eval"), namespace)
            try:
                value = json.dumps(result, allow_nan=False)
            except (TypeError, ValueError, RecursionError):
                value = repr(result)
            value = value[:MAX_VALUE_CHARS]
    except BaseException as err:
        error = describe(err)[:2000]
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    data = json.dumps({"error": error, "value": value, "cpu": cpu}).encode()
    while data:
        data = data[os.write(result_fd, data):]
    return 0 if error is None else 1

sys.exit(_main())
""".replace("MAX_VALUE_CHARS", str(MAX_VALUE_CHARS))


# Defined by the call expression after the program ran, so a program that ends with
# sys.exit() or shadows names still has its tests run. Every result goes to stderr as it
# comes, so a run killed by the deadline still tells which tests finished.
_TEST_HARNESS: Final = r"""
def __refine_tests__(sources, per_test_s):
    import ast, inspect, json, reprlib, signal, sys, types

    VALUES_SHOWN = 4  # the code's values shown where a test failed

    class TestTimeout(BaseException):  # past `except Exception` in the code under test
        pass

    def alarm(signum, frame):
        raise TestTimeout()

    def short(value):
        text = repr(value)
        return text if len(text) <= 120 else text[:117] + "..."

    def report(message):
        sys.stderr.write("\n\x1erefine-test " + json.dumps(message) + "\n")
        sys.stderr.flush()

    brief = reprlib.Repr()
    brief.maxstring = brief.maxother = 60
    brief.maxlist = brief.maxtuple = brief.maxset = brief.maxdict = 8
    brief.maxlevel = 3

    nothing = object()

    def values(frame, skip=nothing):
        # The code's own values in a frame of it: its locals but the parameters (the
        # test shows the arguments), names starting with _, functions, classes, modules
        # and ``skip`` (the value returned, which the finding shows already).
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        count += bool(code.co_flags & inspect.CO_VARARGS)
        count += bool(code.co_flags & inspect.CO_VARKEYWORDS)
        params = code.co_varnames[:count]
        shown = []
        for name, value in list(frame.f_locals.items()):
            if name in params or name.startswith("_") or value is skip:
                continue
            try:
                if callable(value) or isinstance(value, types.ModuleType):
                    continue
                text = brief.repr(value)
            except BaseException:
                continue
            if " at 0x" not in text:  # an object shown by its address says nothing
                shown.append(f"{name} = {text}")
        text = ", ".join(shown[:VALUES_SHOWN])
        return text if len(text) <= 200 else text[:197] + "..."

    try:  # read once, before a test could change the directory
        with open("program.py", encoding="utf-8") as fh:
            program = fh.read().splitlines()
    except BaseException:
        program = []

    def code_line(number):
        # The line itself, unless it says no more than the error (a raise statement).
        line = program[number - 1].strip() if 0 < number <= len(program) else ""
        return f": `{line[:80]}`" if line and not line.startswith("raise") else ""

    def innermost(err, filename):
        # The traceback entry of the last frame in ``filename`` that ``err`` passed.
        tb, last = err.__traceback__, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == filename:
                last = tb
            tb = tb.tb_next
        return last

    def raised_at(err):
        # Where in the code under test an error was raised, with the values there.
        last = innermost(err, "<program>")
        if last is None:
            return ""
        frame = last.tb_frame
        where = f"raised in {frame.f_code.co_name}, line {last.tb_lineno} of the code"
        shown = values(frame)
        return f" ({where}{code_line(last.tb_lineno)}" + (f", where {shown})" if shown else ")")

    def traced(expression, namespace):
        # Evaluate ``expression`` and keep where the first call into the code under test
        # returned, with its values there.
        seen = {}

        def local(frame, event, arg):
            if event == "return" and frame is seen.get("frame"):
                seen["at"] = (frame.f_code.co_name, frame.f_lineno, values(frame, arg))
            return local

        def calls(frame, event, arg):
            if "frame" not in seen and frame.f_code.co_filename == "<program>":
                seen["frame"] = frame
                frame.f_trace_lines = False  # its return is all that is wanted
                return local
            return None

        sys.settrace(calls)
        try:
            value = eval(expression, namespace)
        finally:
            sys.settrace(None)
        if "at" not in seen or not seen["at"][2]:
            return value, ""
        name, line, shown = seen["at"]
        return value, f"; {name} returned at line {line} of the code, where {shown}"

    def explain(source, err, namespace):
        at = innermost(err, "<test>")
        line = None if at is None else at.tb_lineno
        why = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        why += raised_at(err)
        if line is None:
            return f"`{source.strip().splitlines()[-1][:200]}`: {why}"
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return why
        functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        inside = {id(n) for f in ast.walk(tree) if isinstance(f, functions) for n in ast.walk(f)}
        shown = source.splitlines()[line - 1].strip()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assert):
                continue
            if not node.lineno <= line <= (node.end_lineno or node.lineno):
                continue
            shown = ast.get_source_segment(source, node) or shown
            test = node.test
            # `assert a == b` at top level: say what a is (inside a function its names
            # are gone)
            if isinstance(err, AssertionError) and isinstance(test, ast.Compare):
                if id(node) in inside:
                    continue
                left = ast.unparse(test.left)
                try:
                    expression = compile(ast.Expression(test.left), "<test>", "eval")
                    signal.setitimer(signal.ITIMER_REAL, per_test_s)
                    try:
                        value, returned = traced(expression, namespace)
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                    why += f" ({left} is {short(value)}{returned})"
                except TestTimeout:
                    pass
                except BaseException as again:
                    why += f" ({left} raises {type(again).__name__})"
        return f"`{shown[:200]}`: {why}"

    namespace = globals()
    signal.signal(signal.SIGALRM, alarm)
    report("start")
    results = []
    for source in sources:
        error = None
        try:
            signal.setitimer(signal.ITIMER_REAL, per_test_s)
            try:
                exec(compile(source, "<test>", "exec"), namespace)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except TestTimeout:
            last = [line.strip() for line in source.splitlines() if line.strip()][-1:] or [""]
            error = f"`{last[0][:200]}`: did not finish within {per_test_s:g} s"
        except SystemExit as err:  # unittest.main() ends this way
            if err.code not in (None, 0, False):
                error = f"SystemExit: {err.code}"
        except BaseException as err:
            error = explain(source, err, namespace)[:700]
        report(error)
        results.append(error)
    return len(results)
"""
_MARK: Final = "\x1erefine-test "


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
) -> TestsRun:
    """Run ``code``, then each test (Python source) in its namespace, each one on its own.

    A failing assert, an exception and a test running past ``per_test_s`` each fail that
    test only; a failed ``assert a == b`` says what ``a`` was and, where ``a`` called the
    code, where that call returned and the code's own values there (its locals but the
    parameters, briefly); an exception raised in the code says where, with the values
    there. Never raises for anything the program or its tests do.
    """
    call = f"exec({_TEST_HARNESS!r}) or __refine_tests__({list(tests)!r}, {per_test_s!r})"
    # Each test's result comes on standard error, after whatever the program writes there:
    # all of it is read (the run is killed past MAX_DRAIN_BYTES), so that a program
    # writing much there, or many failing tests, cannot push the later results out.
    run = run_python(
        code, call=call, timeout_s=timeout_s, memory_mb=memory_mb, stderr_bytes=MAX_DRAIN_BYTES
    )
    reported: list[str | None] = []
    started = False
    for line in run.stderr.split("\n"):  # not splitlines(): it splits at \x1e too
        if not line.startswith(_MARK):
            continue
        try:
            message = orjson.loads(line[len(_MARK) :])
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


# Each call's result as text: its repr (sets sorted, also inside lists, tuples and dicts,
# and memory addresses left out, so that two runs of the same code agree) and which of its
# arguments the call changed, or the name of the exception it raised, or "timeout".
_CALLS_HARNESS: Final = r"""
def __refine_calls__(sources, per_call_s):
    import ast, re, signal

    class CallTimeout(BaseException):
        pass

    def alarm(signum, frame):
        raise CallTimeout()

    def shown(value, depth=0):
        # Sets at any depth of plain lists, tuples and dicts are sorted: the order a set
        # of strings iterates in changes with each process's hash seed.
        if depth > 20:
            return repr(value)
        if isinstance(value, set | frozenset):
            return type(value).__name__ + repr(sorted(shown(v, depth + 1) for v in value))
        if type(value) is list:
            return "[" + ", ".join(shown(v, depth + 1) for v in value) + "]"
        if type(value) is tuple:
            inner = ", ".join(shown(v, depth + 1) for v in value)
            return "(" + inner + ("," if len(value) == 1 else "") + ")"
        if type(value) is dict:
            items = (shown(k, depth + 1) + ": " + shown(v, depth + 1) for k, v in value.items())
            return "{" + ", ".join(items) + "}"
        return repr(value)

    def parts(source):
        # A call's function and positional arguments as sources, to see whether the call
        # changes them; None for anything else.
        try:
            node = ast.parse(source, mode="eval").body
        except SyntaxError:
            return None
        if not isinstance(node, ast.Call) or any(
            isinstance(a, ast.Starred) for a in node.args
        ) or any(k.arg is None for k in node.keywords):
            return None
        keywords = [(k.arg, ast.unparse(k.value)) for k in node.keywords]
        return ast.unparse(node.func), [ast.unparse(a) for a in node.args], keywords

    RESULT_CHARS = 300  # of each call's result, kept

    def clean(text):
        # Memory addresses left out: two runs of the same code show the same text.
        return re.sub(r" at 0x[0-9a-fA-F]+", "", text)

    def run(source):
        split = parts(source)
        if split is None:
            return shown(eval(source, namespace)), ""
        function, sources, keywords = split
        fn = eval(function, namespace)
        args = [eval(a, namespace) for a in sources]
        kwargs = {k: eval(v, namespace) for k, v in keywords}
        before = [shown(a) for a in args]
        text = shown(fn(*args, **kwargs))
        changed = [str(i + 1) for i, a in enumerate(args) if shown(a) != before[i]]
        return text, " [argument " + ", ".join(changed) + " changed]" if changed else ""

    namespace = globals()
    signal.signal(signal.SIGALRM, alarm)
    results = []
    for source in sources:
        said = ""  # the arguments the call changed, said within RESULT_CHARS
        try:
            signal.setitimer(signal.ITIMER_REAL, per_call_s)
            try:
                text, said = run(source)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except CallTimeout:
            text = "timeout"
        except BaseException as err:
            # An error class of the code's own is shown with its built-in base: the
            # request may name the base ("raises RomanError(ValueError)").
            kind = type(err)
            base = next((c for c in kind.__mro__ if c.__module__ == "builtins"), kind)
            shown_base = "" if base is kind else "(" + base.__name__ + ")"
            text = "raises " + kind.__name__ + shown_base
        results.append(clean(text)[: RESULT_CHARS - len(said)] + said)
    return results
"""


def run_calls(
    code: str,
    calls: Sequence[str],
    *,
    timeout_s: float = TESTS_TIMEOUT_S,
    per_call_s: float = 0.5,
    memory_mb: int = TESTS_MEMORY_MB,
) -> tuple[str, ...] | None:
    """Run ``code``, then evaluate each call expression in its namespace: what each gave,
    as text (its repr, followed by `` [argument 1 changed]`` when the call changed a
    positional argument's value, ``raises ValueError``, ``raises RomanError(ValueError)`` for an
    error class of the code's own with its built-in base, ``timeout``). None when the program failed
    before the calls ran or the run as a whole did not finish. Never raises for anything
    the program does.
    """
    if not calls:
        return ()
    call = f"exec({_CALLS_HARNESS!r}) or __refine_calls__({list(calls)!r}, {per_call_s!r})"
    run = run_python(code, call=call, timeout_s=timeout_s, memory_mb=memory_mb)
    if run.value is None:
        return None
    try:
        value = orjson.loads(run.value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, list) or len(value) != len(calls):
        return None
    return tuple(str(v) for v in value)


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """What one sandboxed run produced.

    ``value`` is the JSON text of ``call``'s return value (its ``repr`` when it is not
    JSON-serialisable), or None without ``call`` or when the run failed. ``error``
    is None on success, else a one-line reason such as
    ``"ZeroDivisionError: division by zero (line 3)"`` or ``"timed out after 5s"``.
    """

    ok: bool
    stdout: str
    value: str | None
    error: str | None
    timed_out: bool
    stderr: str = ""
    cpu_s: float | None = None  # the program's own CPU time, interpreter start excluded


class _Capture:
    """Bytes read from one pipe: the first ``keep`` are kept, the rest only counted."""

    __slots__ = ("data", "keep", "total")

    def __init__(self, keep: int) -> None:
        self.data = bytearray()
        self.keep = keep
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.keep - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def run_python(
    code: str,
    *,
    stdin: str = "",
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    call: str | None = None,
    stderr_bytes: int = MAX_OUTPUT_BYTES,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a sandboxed child; then evaluate ``call``, if given.

    ``stdin`` is the program's standard input; of its standard error the first
    ``stderr_bytes`` are kept. Never raises for anything the program does: failures,
    limits and timeouts come back in the result.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
    if memory_mb <= 0:
        raise ValueError(f"memory_mb must be positive, not {memory_mb!r}")
    with tempfile.TemporaryDirectory(prefix="refine-sandbox-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        (work / "program.py").write_text(code, encoding="utf-8", errors="replace")
        (work / "stdin.txt").write_text(stdin, encoding="utf-8", errors="replace")
        return _run(work, timeout_s, memory_mb, call or "", stderr_bytes)


def _run(
    work: Path, timeout_s: float, memory_mb: int, call: str, stderr_bytes: int
) -> SandboxResult:
    cpu_s = math.ceil(timeout_s) + 1  # the wall-clock deadline normally fires first
    result_r, result_w = os.pipe()
    argv = [
        sys.executable,
        "-I",
        "-S",
        "-X",
        "utf8",
        "-c",
        _BOOTSTRAP,
        str(result_w),
        str(memory_mb * 1024 * 1024),
        str(cpu_s),
        call,
    ]
    try:
        with (work / "stdin.txt").open("rb") as stdin_file:
            proc = subprocess.Popen(
                argv,
                cwd=work,
                env={},
                stdin=stdin_file,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(result_w,),
                start_new_session=True,  # its own process group, killed as a whole
            )
    except OSError as err:
        os.close(result_r)
        os.close(result_w)
        return SandboxResult(False, "", None, f"cannot start the sandbox: {err}", False)
    os.close(result_w)
    deadline = time.monotonic() + timeout_s
    try:
        out, errs, result, reason = _collect(proc, result_r, deadline, stderr_bytes)
        timed_out = reason == "timeout"
        if reason is None and not _wait_exit(proc.pid, deadline):
            timed_out = True
    finally:
        os.close(result_r)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        # Kill the group while its leader is unreaped (running, or a zombie): its pid,
        # and so the group id, cannot have been reused by an unrelated process yet.
        _kill_group(proc.pid)
        try:
            returncode = proc.wait(timeout=_KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            returncode = -signal.SIGKILL
    if timed_out:
        error: str | None = f"timed out after {timeout_s:g}s"
    elif reason is not None:
        error = reason
    else:
        error = _error(returncode, result, errs, expect_value=bool(call))
    value = None
    cpu: float | None = None
    if isinstance(result, dict):
        raw = result.get("value")
        value = raw if isinstance(raw, str) and error is None else None
        took = result.get("cpu")
        cpu = float(took) if isinstance(took, int | float) else None
    return SandboxResult(
        ok=error is None,
        stdout=out.text(),
        value=value,
        error=error,
        timed_out=timed_out,
        stderr=errs.text(),
        cpu_s=cpu,
    )


def _collect(
    proc: subprocess.Popen[bytes], result_fd: int, deadline: float, stderr_bytes: int
) -> tuple[_Capture, _Capture, object, str | None]:
    """Read stdout, stderr and the result pipe until all close, the deadline or too much."""
    assert proc.stdout is not None and proc.stderr is not None
    out, errs, result = (
        _Capture(MAX_OUTPUT_BYTES),
        _Capture(stderr_bytes),
        _Capture(_RESULT_BYTES),
    )
    captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): errs, result_fd: result}
    reason: str | None = None
    with selectors.DefaultSelector() as sel:
        for fd in captures:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "timeout"
                break
            for key, _ in sel.select(remaining):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                captures[key.fd].add(chunk)
            if out.total + errs.total > MAX_DRAIN_BYTES:
                reason = f"output limit exceeded (more than {MAX_DRAIN_BYTES} bytes)"
                break
    parsed: object = None
    if result.data:
        try:
            parsed = orjson.loads(bytes(result.data))
        except orjson.JSONDecodeError:
            parsed = None
    return out, errs, parsed, reason


def _wait_exit(pid: int, deadline: float) -> bool:
    """Wait until the child exits, without reaping it; False when the deadline comes first."""
    delay = 0.0005
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.02)
    return True


def _error(returncode: int, result: object, errs: _Capture, *, expect_value: bool) -> str | None:
    """Why a finished run failed, or None when it succeeded."""
    if isinstance(result, dict) and isinstance(result.get("error"), str):
        return str(result["error"])[:MAX_ERROR_CHARS]
    if returncode < 0:
        name = _signal_name(-returncode)
        hint = {
            "SIGXCPU": " (CPU time limit)",
            "SIGKILL": " (memory limit?)",
            "SIGSEGV": " (crashed)",
        }.get(name, "")
        return f"killed by {name}{hint}"
    if returncode == 0 and result is None and not expect_value:
        return None  # the program ended the process itself (os._exit(0)) after its output
    if returncode != 0 or not isinstance(result, dict):
        tail = errs.text().strip().splitlines()[-1:] or ["no result reported"]
        return f"exit status {returncode}: {tail[0]}"[:MAX_ERROR_CHARS]
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _kill_group(pgid: int) -> None:
    """SIGKILL a process group; gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def syntax_problem(code: str) -> str | None:
    """Why ``code`` does not parse ("line 3: invalid syntax"), or None when it does."""
    try:
        parse_module(code)
    except SyntaxError as err:
        return f"line {err.lineno}: {err.msg}"
    except (ValueError, MemoryError, RecursionError) as err:  # null bytes, absurd nesting
        return f"{type(err).__name__}: {err}"
    return None
