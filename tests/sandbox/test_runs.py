"""Runs of the built-in jobs against a model that answers with hostile programs: nothing
escapes, no record is lost, and a missing kernel layer stops a run before its first call."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from pipeline.sandbox import SandboxMode, current_mode, use_mode
from pipeline.testing.simulator import Simulator
from tests.helpers import read_jsonl, write_jsonl
from tests.hostile_model import (
    CODE_ATTACKS,
    CODE_BENIGN,
    GSM_ATTACKS,
    GSM_BENIGN,
    HostileModel,
)
from tests.sandbox.test_escapes import private_processes

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk-" + "live-4f1c9e2b7a-must-not-leak"
HOME_KEY = "-----BEGIN OPENSSH PRIVATE KEY----- " + "c2VjcmV0LWtleS0xMjM="
INPUT_SECRET = "INPUT-" + "secret-note-83a1"
WITHOUT_LANDLOCK = [sys.executable, str(ROOT / "tests" / "without_landlock.py")]


def refine(
    args: list[str], home: Path, *, without_landlock: bool = False
) -> subprocess.CompletedProcess[str]:
    """`refine ARGS` in its own process, with a secret API key in its environment and a
    key file in its home directory (what a hostile program would go after)."""
    command = [sys.executable, "-m", "pipeline.cli", *args]
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "OPENAI_API_KEY": API_KEY}
    return subprocess.run(
        (WITHOUT_LANDLOCK if without_landlock else []) + command,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home directory holding an SSH key."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_text(HOME_KEY)
    key.chmod(stat.S_IRUSR | stat.S_IWUSR)
    return home


def records(names: list[str], field: str, target: bool) -> list[dict[str, Any]]:
    """One record per attack, carrying a secret note in a field the model never sees."""
    rows = []
    for name in names:
        row: dict[str, Any] = {"id": name, field: f"ATTACK:{name} How many apples are left?"}
        row["note"] = INPUT_SECRET
        if target:
            row["target"] = 42
        rows.append(row)
    return rows


def assert_nothing_escaped(run: Path, model: HostileModel, marker: Path) -> None:
    """No secret in the run's files or in what the model was sent; no stray connection,
    no planted file, no process left."""
    seen = {
        "traces": (run / "traces.jsonl").read_text(),
        "outputs": (run / "outputs.jsonl").read_text(),
        "manifest": (run / "manifest.json").read_text(),
        "requests": orjson.dumps(model.bodies).decode(),
    }
    for where, text in seen.items():
        for secret in (API_KEY, HOME_KEY, "c2VjcmV0LWtleS0xMjM="):
            assert secret not in text, f"{secret[:12]}... leaked into {where}"
    assert INPUT_SECRET not in seen["requests"] and INPUT_SECRET not in seen["traces"]
    assert "checkpoint.jsonl" not in seen["requests"]  # the run directory's listing
    assert model.strays == []
    assert not marker.exists() and not Path(f"{marker}.planted").exists()
    assert private_processes() == []


def outcome(run: Path) -> dict[str, Mapping[str, Any]]:
    """Each record's output line, by id."""
    return {str(o["id"]): o for o in read_jsonl(run / "outputs.jsonl")}


def hostile_run(
    tmp_path: Path, home: Path, job: str, programs: Mapping[str, str], field: str
) -> dict[str, Mapping[str, Any]]:
    """`refine run JOB` over one record per program against a model answering with it: each
    record's output line. Checks the run exits 0 or 1, no record is lost and nothing
    escaped."""
    inp = write_jsonl(tmp_path / "input.jsonl", records(list(programs), field, job == "gsm"))
    run, marker = tmp_path / "run", tmp_path / "survived"
    values: dict[str, object] = {"home": home, "input": inp, "run": run, "marker": marker}
    model = HostileModel(programs, values)
    with model.serve() as url:
        args = ["run", job, str(inp), "--out", str(run), "--base-url", url, "--model", "m"]
        done = refine([*args, "--max-iters", "1", "--concurrency", "8", "--quiet"], home)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    outputs = outcome(run)
    assert sorted(outputs) == sorted(programs)  # no record lost
    assert {o["status"] for o in outputs.values()} <= {"done", "failed"}
    assert_nothing_escaped(run, model, marker)
    return outputs


def test_hostile_gsm_programs_escape_nothing(tmp_path: Path, home: Path) -> None:
    """Every escape the gsm job's programs try fails; each record ends done or failed with
    a finding, the run exits 0 or 1, and the record beside them is right."""
    programs = {**GSM_ATTACKS, "benign": GSM_BENIGN}
    outputs = hostile_run(tmp_path, home, "gsm", programs, "input")
    assert outputs["benign"]["status"] == "done"
    assert outputs["benign"]["metrics"]["correct"] is True
    for name in ("home-key", "parent-environ", "input-file", "run-directory", "spawn"):
        assert "Permission" in str(outputs[name]["metrics"]), name  # a clear finding
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert manifest["sandbox"]["mode"] == "strict" and manifest["sandbox"]["missing"] == {}


def test_hostile_code_programs_escape_nothing(tmp_path: Path, home: Path) -> None:
    """A code job's tests that read secrets fail without them; the clean answer beside
    them passes its tests."""
    programs = {**CODE_ATTACKS, "benign": CODE_BENIGN}
    outputs = hostile_run(tmp_path, home, "code-improve", programs, "task")
    assert outputs["benign"]["metrics"]["tests_passed"] == 2
    for name in CODE_ATTACKS:
        assert outputs[name]["metrics"]["tests_passed"] == 1, name  # the reading test failed


def test_a_missing_layer_stops_the_run_before_any_call(tmp_path: Path, home: Path) -> None:
    """Without Landlock a gsm run exits 2 naming it and --sandbox weak; no call is made."""
    inp = write_jsonl(tmp_path / "input.jsonl", records(["benign"], "input", target=True))
    run = tmp_path / "run"
    model = HostileModel({"benign": GSM_BENIGN}, {})
    with model.serve() as url:
        args = ["run", "gsm", str(inp), "--out", str(run), "--base-url", url, "--quiet"]
        done = refine(args, home, without_landlock=True)
    assert done.returncode == 2
    assert "landlock" in done.stderr and "--sandbox weak" in done.stderr
    assert model.bodies == [] and not (run / "outputs.jsonl").exists()


def test_weak_isolation_is_one_invocations_choice(tmp_path: Path, home: Path) -> None:
    """--sandbox weak runs without the missing layer and the manifest says so; a resume
    without it stops again, with it goes on."""
    inp = write_jsonl(tmp_path / "input.jsonl", records(["benign"], "input", target=True))
    run = tmp_path / "run"
    model = HostileModel({"benign": GSM_BENIGN}, {})
    with model.serve() as url:
        args = ["run", "gsm", str(inp), "--out", str(run), "--base-url", url, "--quiet"]
        done = refine([*args, "--sandbox", "weak"], home, without_landlock=True)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "sandbox: weak" in done.stderr and "landlock" in done.stderr
        sandbox = orjson.loads((run / "manifest.json").read_bytes())["sandbox"]
        assert sandbox["mode"] == "weak" and "landlock" in sandbox["missing"]
        assert "seccomp" in sandbox["layers"]  # what the kernel had is still in force
        assert refine(["resume", str(run), "--quiet"], home, without_landlock=True).returncode == 2
        again = refine(["resume", str(run), "--sandbox", "weak"], home, without_landlock=True)
        assert again.returncode == 0, again.stderr[-3000:]
    assert outcome(run)["benign"]["metrics"]["correct"] is True


def test_jobs_that_run_no_programs_are_unaffected(
    tmp_path: Path, home: Path, sim: Simulator
) -> None:
    """commongen runs where Landlock is missing, in strict mode, and records no sandbox."""
    rows = [{"id": "a", "concepts": ["dog", "ball", "park"]}]
    inp = write_jsonl(tmp_path / "input.jsonl", rows)
    run = tmp_path / "run"
    args = ["run", "commongen", str(inp), "--out", str(run), "--base-url", sim.url]
    done = refine(
        [*args, "--model", "sim-model", "--max-iters", "1", "--quiet"], home, without_landlock=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sandbox" not in orjson.loads((run / "manifest.json").read_bytes())


def test_refine_sandbox_shows_each_layer_and_a_denied_self_test(home: Path) -> None:
    """`refine sandbox` exits 0 with every layer in force and every attempt denied; where
    Landlock is missing it says so and exits 2."""
    done = refine(["sandbox", "--json"], home)
    assert done.returncode == 0, done.stdout + done.stderr
    found = orjson.loads(done.stdout)
    assert found["ok"] is True and found["isolation"]["missing"] == {}
    assert len(found["self_test"]) >= 6 and all(a["denied"] for a in found["self_test"])
    missing = refine(["sandbox"], home, without_landlock=True)
    assert missing.returncode == 2
    assert "landlock      MISSING" in missing.stdout and "--sandbox weak" in missing.stdout


def test_strict_children_refuse_to_run_unconfined(tmp_path: Path) -> None:
    """Where Landlock is missing, a strict child never runs the program (its output is
    absent, the error names the layer); a weak one runs it and reports the gap."""
    script = (
        "from pipeline.sandbox import SandboxPolicy, SandboxMode, run_python\n"
        "for mode in (SandboxMode.STRICT, SandboxMode.WEAK):\n"
        "    r = run_python(\"print('ran')\", policy=SandboxPolicy(mode))\n"
        "    missing = sorted(m.value for m in r.confinement.missing)\n"
        "    print(mode.value, repr(r.stdout), r.error, missing)\n"
    )
    done = subprocess.run(
        [*WITHOUT_LANDLOCK, sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    strict, weak = done.stdout.splitlines()
    assert strict.startswith("strict '' sandbox: not run without kernel isolation (landlock:")
    assert strict.endswith("['landlock']")
    assert weak == "weak 'ran\\n' None ['landlock']"


@pytest.mark.anyio
async def test_the_mode_reaches_worker_threads_and_defaults_to_strict() -> None:
    """use_mode reaches the threads hooks run in (anyio copies the context); outside any
    use_mode the mode is strict."""
    assert await anyio.to_thread.run_sync(current_mode) is SandboxMode.STRICT
    with use_mode(SandboxMode.WEAK):
        assert await anyio.to_thread.run_sync(current_mode) is SandboxMode.WEAK
    assert current_mode() is SandboxMode.STRICT
