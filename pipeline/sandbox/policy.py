"""What a sandboxed program is confined by: the mode, the layers, and what was in force.

The mode travels in a context variable, not a global: a run sets it around the code that
checks answers (``use_mode``), and the worker threads hooks run in (``anyio.to_thread``
copies the context) read it in ``run_python``. Anything that never set it gets
``SandboxMode.STRICT``: a missing setting fails closed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "ALL_LAYERS",
    "KERNEL_LAYERS",
    "Confinement",
    "Layer",
    "SandboxMode",
    "SandboxPolicy",
    "current_mode",
    "use_mode",
]


class SandboxMode(StrEnum):
    """How much isolation a program needs before it may run (``--sandbox``)."""

    STRICT = "strict"  # every kernel layer in force, or the program does not run
    WEAK = "weak"  # the layers this machine has; at least the limits and the audit hook


class Layer(StrEnum):
    """One layer of the sandbox (docs/sandbox.md says what each one stops)."""

    LIMITS = "limits"  # memory, CPU, file size, open files, processes
    PRIVILEGES = "privileges"  # no capability, a user id of its own (when started as root)
    NO_NEW_PRIVS = "no_new_privs"  # nothing it starts gains a privilege
    LANDLOCK = "landlock"  # file system, TCP, signals and abstract sockets
    SECCOMP = "seccomp"  # exec, new processes, sockets, other processes, kernel admin
    AUDIT_HOOK = "audit_hook"  # Python-level refusals: a second line, never relied on


# The kernel's layers, which strict mode requires.
KERNEL_LAYERS = frozenset({Layer.PRIVILEGES, Layer.NO_NEW_PRIVS, Layer.LANDLOCK, Layer.SECCOMP})
ALL_LAYERS = frozenset(Layer)


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """How one program is confined: the mode, and the layers asked for (all, normally;
    ``refine sandbox`` asks for fewer to show what each one stops)."""

    mode: SandboxMode = SandboxMode.STRICT
    layers: frozenset[Layer] = ALL_LAYERS


@dataclass(frozen=True, slots=True)
class Confinement:
    """What a child reported before its program ran: each layer in force (with what it
    holds) or missing (with why), and the kernel's Landlock ABI (0: none)."""

    applied: Mapping[Layer, str] = field(default_factory=dict)
    missing: Mapping[Layer, str] = field(default_factory=dict)
    landlock_abi: int = 0

    @classmethod
    def from_json(cls, data: object) -> Confinement | None:
        """A child's report (None when it is not one)."""
        if not isinstance(data, dict):
            return None
        known = {layer.value: layer for layer in Layer}

        def layers(value: object) -> dict[Layer, str]:
            items = value.items() if isinstance(value, dict) else ()
            return {known[k]: str(v) for k, v in items if k in known}

        abi = data.get("landlock_abi")
        return cls(
            layers(data.get("applied")),
            layers(data.get("missing")),
            abi if isinstance(abi, int) else 0,
        )

    def as_json(self) -> dict[str, Any]:
        """The report as the manifest keeps it."""
        return {
            "landlock_abi": self.landlock_abi,
            "layers": {layer.value: what for layer, what in self.applied.items()},
            "missing": {layer.value: why for layer, why in self.missing.items()},
        }


_MODE: ContextVar[SandboxMode] = ContextVar("refine_sandbox_mode", default=SandboxMode.STRICT)


def current_mode() -> SandboxMode:
    """The mode programs run in here: the innermost ``use_mode``'s, else strict."""
    return _MODE.get()


@contextlib.contextmanager
def use_mode(mode: SandboxMode) -> Iterator[None]:
    """Run programs in ``mode`` within this block (and the tasks and threads it starts)."""
    token = _MODE.set(mode)
    try:
        yield
    finally:
        _MODE.reset(token)
