"""One sandboxed run: a child ``python -I -S``, confined by the kernel, killed on its deadline.

The bootstrap below runs in the child before the program: it confines the process
(``kernel.confine``: limits, privileges, no_new_privs, Landlock, seccomp) and installs the
audit hook, then runs the program and, with a ``call``, that expression, reporting every
outcome (and what was in force) as one JSON object on a result pipe.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import orjson

from ..core.pyast import parse_module
from .policy import Confinement, SandboxMode, SandboxPolicy, current_mode

__all__ = ["MAX_DRAIN_BYTES", "MAX_OUTPUT_BYTES", "SandboxResult", "run_python", "syntax_problem"]

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
# The child imports ``kernel`` from here, by path (it has no site-packages).
_HOME: Final = str(Path(__file__).resolve().parent)
# Top-level modules the child drops once it is confined.
_SHED: Final = ("kernel", "ctypes", "_ctypes")

# Runs in the child, before the program: confines the process (``kernel.confine``), then
# runs the program. Kept free of anything that could fail on an odd program: it reports
# every outcome as one JSON object on the result pipe. It imports little before the program
# (json, traceback only when needed): the interpreter's start is most of a run's cost.
_BOOTSTRAP: Final = r"""
import os, sys, time

def _report(fd, message):
    import json
    data = json.dumps(message).encode()
    while data:
        data = data[os.write(fd, data):]

def _main():
    result_fd, home, memory, cpu, layers, strict, call = sys.argv[1:]
    result_fd, layers = int(result_fd), layers.split(",")
    import _signal
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)  # a write past the limit fails, not kills
    with open("program.py", encoding="utf-8") as fh:
        source = fh.read()
    sys.argv = ["program.py"]
    # The modules that confined the process leave with their names: the program imports
    # ctypes afresh, which the audit hook refuses.
    sys.path.insert(0, home)
    try:
        import kernel
        confinement = kernel.confine(int(memory), int(cpu), layers)
    except BaseException as err:  # never run a program that was not confined as asked
        _report(result_fd, {"error": f"sandbox: cannot confine the program: {err!r}"[:500]})
        return 1
    finally:
        del sys.path[0]
        for name in [n for n in sys.modules if n.partition(".")[0] in SHED]:
            del sys.modules[name]
    # Only now: the first child caches the confinement code's bytecode for the next ones.
    sys.dont_write_bytecode = True
    if strict == "1" and confinement["missing"]:
        why = "; ".join(f"{k}: {v}" for k, v in confinement["missing"].items())
        error = "sandbox: not run without kernel isolation (" + why + ")"
        _report(result_fd, {"error": error[:500], "confinement": confinement})
        return 1

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
        import traceback
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
        if "audit_hook" in layers:
            sys.addaudithook(hook)
            confinement["applied"]["audit_hook"] = "refuses sockets, processes, ctypes, writes"
        started = time.process_time()
        try:
            exec(code, namespace)
        except SystemExit as err:
            if err.code not in (None, 0):
                error = f"SystemExit: {err.code}"
        cpu = time.process_time() - started
        if error is None and call:
            result = eval(compile(call, "<call>", "eval"), namespace)
            import json
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
    _report(result_fd, {"error": error, "value": value, "cpu": cpu, "confinement": confinement})
    return 0 if error is None else 1

sys.exit(_main())
""".replace("MAX_VALUE_CHARS", str(MAX_VALUE_CHARS)).replace("SHED", repr(_SHED))


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
    # what the child reported in force before the program ran (None: it never got so far)
    confinement: Confinement | None = field(default=None, compare=False)


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
    policy: SandboxPolicy | None = None,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a sandboxed child; then evaluate ``call``, if given.

    ``stdin`` is the program's standard input; of its standard error the first
    ``stderr_bytes`` are kept. The child is confined by ``policy`` (default: every layer,
    in the mode ``use_mode`` set, else strict); in strict mode a layer the kernel lacks
    means the program does not run, and the result says why. Never raises for anything
    the program does: failures, limits and timeouts come back in the result.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
    if memory_mb <= 0:
        raise ValueError(f"memory_mb must be positive, not {memory_mb!r}")
    with tempfile.TemporaryDirectory(prefix="refine-sandbox-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        (work / "program.py").write_text(code, encoding="utf-8", errors="replace")
        (work / "stdin.txt").write_text(stdin, encoding="utf-8", errors="replace")
        return _run(
            work,
            timeout_s,
            memory_mb,
            call or "",
            stderr_bytes,
            policy or SandboxPolicy(current_mode()),
        )


def _run(
    work: Path,
    timeout_s: float,
    memory_mb: int,
    call: str,
    stderr_bytes: int,
    policy: SandboxPolicy,
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
        _HOME,
        str(memory_mb * 1024 * 1024),
        str(cpu_s),
        ",".join(sorted(policy.layers)),
        "1" if policy.mode is SandboxMode.STRICT else "0",
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
    confinement = None
    if isinstance(result, dict):
        raw = result.get("value")
        value = raw if isinstance(raw, str) and error is None else None
        took = result.get("cpu")
        cpu = float(took) if isinstance(took, int | float) else None
        confinement = Confinement.from_json(result.get("confinement"))
    return SandboxResult(
        ok=error is None,
        stdout=out.text(),
        value=value,
        error=error,
        timed_out=timed_out,
        stderr=errs.text(),
        cpu_s=cpu,
        confinement=confinement,
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
