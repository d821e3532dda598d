"""Which isolation this machine gives programs, found by running one.

A run of a job that runs programs probes once before its first call: a child confines
itself with every layer it can and reports what held. Strict mode refuses to go on when a
kernel layer is missing (``require_isolation``), naming what and why.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SandboxError
from .policy import KERNEL_LAYERS, Confinement, Layer, SandboxMode, SandboxPolicy
from .process import run_python

__all__ = ["Isolation", "probe", "require_isolation"]

_PROBE_TIMEOUT_S = 30.0  # a machine this busy still answers; a healthy one takes 50 ms


@dataclass(frozen=True, slots=True)
class Isolation:
    """The isolation in force for a run's programs: its mode and what a child reported."""

    mode: SandboxMode
    confinement: Confinement
    machine: str  # "linux x86_64"
    user: str  # "root" or "uid 1000": the parent's, which decides what leaving root means

    @property
    def missing(self) -> Mapping[Layer, str]:
        """Kernel layers not in force, with why."""
        return {k: v for k, v in self.confinement.missing.items() if k in KERNEL_LAYERS}

    def as_json(self) -> dict[str, Any]:
        """What the manifest records."""
        return {
            "mode": self.mode.value,
            "machine": self.machine,
            "user": self.user,
            **self.confinement.as_json(),
        }

    def describe(self) -> str:
        """One line for the run's log."""
        held = ", ".join(layer.value for layer in self.confinement.applied)
        line = f"{self.mode.value}; {held} in force"
        if self.confinement.landlock_abi:
            line += f" (Landlock ABI {self.confinement.landlock_abi})"
        if self.missing:
            line += "; missing: " + _reasons(self.missing)
        return line


def _reasons(missing: Mapping[Layer, str]) -> str:
    return "; ".join(f"{layer.value} ({why})" for layer, why in missing.items())


def probe(mode: SandboxMode) -> Isolation:
    """What a program gets here: one child confined with every layer the kernel has."""
    result = run_python("", timeout_s=_PROBE_TIMEOUT_S, policy=SandboxPolicy(SandboxMode.WEAK))
    confinement = result.confinement or Confinement(
        missing=dict.fromkeys(sorted(KERNEL_LAYERS), result.error or "the probe reported nothing")
    )
    user = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    return Isolation(mode, confinement, f"{sys.platform} {platform.machine()}", user)


def require_isolation(mode: SandboxMode) -> Isolation:
    """The isolation in force, probed; raises SandboxError in strict mode when a kernel
    layer is missing."""
    isolation = probe(mode)
    if mode is SandboxMode.STRICT and isolation.missing:
        raise SandboxError(
            "this job runs model-written programs, and kernel isolation for them is "
            f"missing here: {_reasons(isolation.missing)}. Run where the kernel has it "
            "(docs/sandbox.md), or accept weaker isolation with --sandbox weak"
        )
    return isolation
