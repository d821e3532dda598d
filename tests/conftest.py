"""Shared fixtures: the anyio backend, the simulator, and small input files."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipeline.testing.simulator import SimConfig, Simulator


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio (the backend the CLI uses)."""
    return "asyncio"


@pytest.fixture
def sim() -> Iterator[Simulator]:
    """A fresh simulator with small latency, started for one test."""
    with Simulator(SimConfig(latency_s=0.005, p_done=0.3)) as s:
        yield s
