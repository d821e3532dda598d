"""``refine sandbox``: the isolation programs get on this machine, and a self-test under it.

The self-test runs one small program under the kernel's layers alone (no audit hook, so
what stops it is the kernel) that tries what a hostile program would: read the home
directory and the parent's environment, connect over TCP, start a program and a process,
signal its parent, write a file. Each attempt must end in a PermissionError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..sandbox import KERNEL_LAYERS, Isolation, Layer, SandboxMode, SandboxPolicy, probe, run_python

__all__ = ["Attempt", "SandboxCheck", "check", "render"]

# Each attempt prints one JSON line: [what, denied, what happened]. ``denied`` means a
# PermissionError (EPERM or EACCES): the kernel said no. Anything else, success or another
# error (a connection refused, say), means the layer let it through.
_SELF_TEST = r"""
import json, os, socket

def attempt(what, action):
    try:
        action()
        outcome = [what, False, "allowed"]
    except OSError as err:
        outcome = [what, isinstance(err, PermissionError), f"{type(err).__name__}: {err}"]
    print(json.dumps(outcome), flush=True)

def fork():
    if os.fork() == 0:
        os._exit(0)

attempt(f"read the home directory ({HOME})", lambda: os.listdir(HOME))
attempt("read the parent's environment", lambda: open(f"/proc/{os.getppid()}/environ").read())
attempt("connect over TCP (127.0.0.1:9)", lambda: socket.create_connection(("127.0.0.1", 9), 1))
attempt("start a program (/bin/true)", lambda: os.posix_spawn("/bin/true", ["true"], {}))
attempt("start a process (fork)", fork)
attempt("signal the parent", lambda: os.kill(os.getppid(), 0))
attempt("write a file in its own directory", lambda: open("written.txt", "w").close())
"""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One thing the self-test tried, and whether the kernel denied it."""

    what: str
    denied: bool
    outcome: str


@dataclass(frozen=True, slots=True)
class SandboxCheck:
    """What ``refine sandbox`` found: the isolation in force and the self-test's attempts."""

    isolation: Isolation
    attempts: tuple[Attempt, ...]
    error: str | None  # why the self-test did not run to its end, if it did not

    @property
    def ok(self) -> bool:
        """Every kernel layer in force, and every attempt denied."""
        return (
            not self.isolation.missing
            and self.error is None
            and bool(self.attempts)
            and all(a.denied for a in self.attempts)
        )

    def as_json(self) -> dict[str, Any]:
        """The findings as ``refine sandbox --json`` prints them."""
        return {
            "ok": self.ok,
            "isolation": self.isolation.as_json(),
            "self_test": [
                {"what": a.what, "denied": a.denied, "outcome": a.outcome} for a in self.attempts
            ],
            "error": self.error,
        }


def check() -> SandboxCheck:
    """Probe this machine's isolation and run the self-test under the kernel's layers."""
    isolation = probe(SandboxMode.STRICT)
    program = f"HOME = {str(Path.home())!r}\n" + _SELF_TEST
    result = run_python(
        program, timeout_s=30.0, policy=SandboxPolicy(SandboxMode.WEAK, KERNEL_LAYERS)
    )
    attempts = []
    for line in result.stdout.splitlines():
        try:
            what, denied, outcome = orjson.loads(line)
        except (orjson.JSONDecodeError, ValueError, TypeError):
            continue
        attempts.append(Attempt(str(what), denied is True, str(outcome)))
    return SandboxCheck(isolation, tuple(attempts), result.error)


def render(found: SandboxCheck) -> str:
    """The findings as text."""
    iso = found.isolation
    lines = [f"isolation of the programs jobs run, on {iso.machine} (refine runs as {iso.user}):"]
    for layer in Layer:
        if layer in iso.confinement.applied:
            lines.append(f"  {layer.value:<13} {iso.confinement.applied[layer]}")
        elif layer in iso.confinement.missing:
            lines.append(f"  {layer.value:<13} MISSING: {iso.confinement.missing[layer]}")
    lines.append("self-test under the kernel's layers alone (no audit hook):")
    for a in found.attempts:
        lines.append(f"  {'denied ' if a.denied else 'ALLOWED'}  {a.what}: {a.outcome}")
    if found.error is not None:
        lines.append(f"  the self-test ended early: {found.error}")
    if found.ok:
        lines.append("strict isolation is in force: runs of jobs that run programs go ahead")
    else:
        lines.append(
            "strict isolation is NOT in force: runs of jobs that run programs stop before "
            "their first call (exit 2) unless given --sandbox weak (docs/sandbox.md)"
        )
    return "\n".join(lines)
