"""Commands that call no model start at once: they import no HTTP or provider SDK."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline import Settings, run
from pipeline.commands.status import collect
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import tasks, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
SDKS = ("openai", "anthropic", "aiohttp", "httpx", "httpx2", "httpcore", "pydantic", "ray")

# Runs `refine ARGS` in this interpreter, then prints the SDKs it imported.
PROBE = f"""
import contextlib, io, sys
from pipeline.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as stop:
        code = stop.code
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({SDKS!r}))
print(f"{{code}}|{{','.join(loaded)}}")
"""


def probe(*argv: str, first: str = "") -> tuple[str, str]:
    """`refine ARGV`'s exit status and the SDKs it imported (after ``first`` ran)."""
    done = subprocess.run(
        [sys.executable, "-c", first + PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    code, _, loaded = done.stdout.strip().splitlines()[-1].rpartition("|")
    assert code in ("0", "None"), done.stderr
    return code, loaded


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small finished run against the simulator."""
    tmp = tmp_path_factory.mktemp("imports")
    inp = write_jsonl(tmp / "in.jsonl", tasks(2))
    with Simulator(SimConfig(latency_s=0.0, p_done=0.0)) as sim:
        settings = Settings(model="sim-model", base_url=sim.url, max_iters=1)
        assert run("code-improve", inp, tmp / "run", settings, api_key="k").exit_code == 0
    return tmp / "run"


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["jobs"],
        ["jobs", "code-improve"],
        ["status", "{run}"],
        ["status", "{run}", "--json"],
        ["show", "{run}", "r0"],
        ["export", "{run}", "{run}/out.csv"],
        ["report", "{run}"],
        ["sandbox", "--json"],
    ],
)
def test_a_command_that_calls_no_model_imports_no_sdk(finished_run: Path, args: list[str]) -> None:
    """`refine --help`, jobs, status, show, export, report and sandbox leave every SDK
    unimported."""
    if args[0] == "report":
        pytest.importorskip("matplotlib")
    _, loaded = probe(*[a.format(run=finished_run) for a in args])
    assert loaded == "", f"refine {' '.join(args)} imported {loaded}"


def test_the_probe_sees_an_sdk_a_command_imports(finished_run: Path) -> None:
    """The same probe on a command that calls a model names the SDK: the check can fail."""
    _, loaded = probe("status", str(finished_run), first="import pipeline.client.chat\n")
    assert "openai" in loaded.split(",")


def test_status_reads_no_trace(finished_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`refine status` counts a finished run from outputs.jsonl and the journal: it never
    opens traces.jsonl, the run directory's largest file."""
    opened: list[str] = []
    real = Path.open

    def watched(self: Path, *args: Any, **kw: Any) -> Any:
        opened.append(self.name)
        return real(self, *args, **kw)

    monkeypatch.setattr(Path, "open", watched)
    info = collect(finished_run)
    assert info["done"] == 2 and "outputs.jsonl" in opened
    assert "traces.jsonl" not in opened
