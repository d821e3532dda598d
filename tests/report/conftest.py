"""Fixtures of the report's tests: matplotlib or a skip, and a 25-record run, reported."""

from __future__ import annotations

import pytest

from pipeline import Settings, run
from pipeline.report import write_report
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, write_jsonl
from tests.report.runs import Reported, concept_sets


@pytest.fixture
def matplotlib() -> None:
    """Skip a test that draws plots when matplotlib is not installed."""
    pytest.importorskip("matplotlib")


@pytest.fixture(scope="session")
def reported(tmp_path_factory: pytest.TempPathFactory) -> Reported:
    """25 CommonGen records, some failing and some with unparseable feedback, reported."""
    pytest.importorskip("matplotlib")
    root = tmp_path_factory.mktemp("run25")
    inp = write_jsonl(root / "in.jsonl", concept_sets(25))
    # Faults without retries: some records fail outright, some answers are cut short.
    config = SimConfig(p_done=0.2, p_500=0.03, p_length=0.08, faults_seed=3)
    with Simulator(config) as sim:
        settings = Settings(
            model="gpt-4o-mini", base_url=sim.url, max_iters=2, concurrency=8, max_retries=0
        )
        run("commongen", inp, root / "run", settings, api_key="k", show_progress=False)
    page = write_report(root / "run").html
    traces = {str(t["id"]): t["steps"] for t in read_jsonl(root / "run" / "traces.jsonl")}
    return Reported(root / "run", page, read_jsonl(root / "run" / "outputs.jsonl"), traces)
