"""How the Batch API driver proceeds beyond the run's settings: file limits, window, pacing.

The defaults are OpenAI's published limits. ``from_env`` reads overrides for providers
with other limits (Azure takes 100,000 lines a file) and for tests that need tiny files
or fast pacing; none of them changes what a run computes, so they are not settings
recorded in the manifest.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ...errors import ConfigError

__all__ = ["ENV_PREFIX", "BatchConfig"]

ENV_PREFIX = "REFINE_BATCH_"


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """Limits and pacing of the Batch API driver."""

    max_lines: int = 50_000  # requests in one batch input file
    max_bytes: int = 200_000_000  # bytes of one batch input file ("200 MB", read as the smaller)
    # Records held at once (their steps stay in memory): the driver's memory bound. An
    # input with more records goes through in windows of this size.
    window: int = 100_000
    creates_per_s: float = 2.0  # uploads and batch creations, at a fixed pace
    polls_per_s: float = 10.0  # retrieves, listings, downloads and deletions, at a fixed pace

    def __post_init__(self) -> None:
        for name in ("max_lines", "max_bytes", "window"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{ENV_PREFIX}{name.upper()} must be >= 1")
        for name in ("creates_per_s", "polls_per_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{ENV_PREFIX}{name.upper()} must be > 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BatchConfig:
        """The defaults, overridden by ``REFINE_BATCH_<FIELD>`` variables."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            try:
                values[f.name] = float(raw) if f.name.endswith("_per_s") else int(raw)
            except ValueError as err:
                raise ConfigError(f"{ENV_PREFIX}{f.name.upper()}: not a number: {raw!r}") from err
        return cls(**values)
