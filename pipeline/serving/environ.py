"""Whole-number settings of the embedded server read from the environment."""

from __future__ import annotations

import os

from ..errors import ServerStartError

__all__ = ["env_count"]


def env_count(name: str, default: int, *, least: int, expected: str) -> int:
    """``$name`` as a whole number of at least ``least``, or ``default`` when unset or blank.

    Anything else stops the run before the server starts: ``expected`` says what was.
    """
    configured = os.environ.get(name, "").strip()
    if not configured:
        return default
    if not configured.isdigit() or int(configured) < least:
        raise ServerStartError(f"{name}={configured!r}: expected {expected}")
    return int(configured)
