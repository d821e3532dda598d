"""Ways out are named: a wrong model is corrected in place, a fixed input line is read again."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from pipeline import RunDirError, Settings, run
from pipeline.runs.session import Halting, conclude
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl


def go(sim: Simulator, inp: Path, out: Path, model: str = "sim-model") -> int:
    settings = Settings(model=model, base_url=sim.url, max_iters=1)
    return run("code-improve", inp, out, settings, api_key="k", show_progress=False).exit_code


def test_a_run_with_no_successful_call_takes_the_corrected_model(tmp_path: Path) -> None:
    """A wrong --model that never got an answer is corrected by running the right command
    on the same RUN_DIR: the manifest is rewritten, every record runs."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    with Simulator(SimConfig(models=("sim-model",))) as sim:
        assert go(sim, inp, tmp_path / "run", model="sim-modle") == 2  # 404: unknown model
        assert go(sim, inp, tmp_path / "run") == 0
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert (manifest["model"], manifest["runs"]) == ("sim-model", 1)
    assert [o["status"] for o in read_jsonl(tmp_path / "run" / "outputs.jsonl")] == ["done"] * 3


def test_records_failed_without_a_call_run_again_after_the_correction(tmp_path: Path) -> None:
    """Records that failed with no call made (their prompt too long for a context) are not
    kept as finished when the command is corrected: they run under the new settings."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    with Simulator(SimConfig()) as sim:
        tight = Settings(model="sim-model", base_url=sim.url, max_iters=1, context_tokens=5)
        summary = run(
            "code-improve", inp, tmp_path / "run", tight, api_key="k", show_progress=False
        )
        assert summary.exit_code == 1
        assert go(sim, inp, tmp_path / "run", model="sim-model-2") == 0
    outputs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert [o["status"] for o in outputs] == ["done", "done"]


def test_the_refusal_of_another_model_names_the_way_out(sim: Simulator, tmp_path: Path) -> None:
    """Once calls succeeded, another --model is refused with how to start over or go on."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    assert go(sim, inp, tmp_path / "run") == 0
    with pytest.raises(RunDirError) as caught:
        go(sim, inp, tmp_path / "run", model="other-model")
    text = str(caught.value)
    assert "another --out" in text and f"delete {tmp_path / 'run'}" in text
    assert "refine resume" in text


def bad_input(path: Path) -> Path:
    rows = [orjson.dumps(r) for r in tasks(4)]
    rows[1] = b'{"id": "r1", "task": '  # cut short: invalid JSON
    path.write_bytes(b"\n".join(rows) + b"\n")
    return path


def test_a_line_fixed_in_place_is_read_again(sim: Simulator, tmp_path: Path) -> None:
    """A rejected line corrected where it stands is accepted as the same input, runs, and
    leaves errors.jsonl, so the next runs exit 0."""
    inp = bad_input(tmp_path / "in.jsonl")
    assert go(sim, inp, tmp_path / "run") == 1
    assert [e["line"] for e in read_jsonl(tmp_path / "run" / "errors.jsonl")] == [2]
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in tasks(4)))  # line 2 fixed
    assert go(sim, inp, tmp_path / "run") == 0
    assert read_jsonl(tmp_path / "run" / "errors.jsonl") == []
    assert sorted(str(o["id"]) for o in read_jsonl(tmp_path / "run" / "outputs.jsonl")) == [
        "r0", "r1", "r2", "r3",
    ]  # fmt: skip
    assert go(sim, inp, tmp_path / "run") == 0


def test_a_rejected_line_emptied_leaves_errors_too(sim: Simulator, tmp_path: Path) -> None:
    """A rejected line blanked in place (the record dropped) no longer counts as unreadable."""
    inp = bad_input(tmp_path / "in.jsonl")
    assert go(sim, inp, tmp_path / "run") == 1
    lines = inp.read_bytes().split(b"\n")
    lines[1] = b""
    inp.write_bytes(b"\n".join(lines))
    assert go(sim, inp, tmp_path / "run") == 0
    assert read_jsonl(tmp_path / "run" / "errors.jsonl") == []


def test_a_change_beside_the_rejected_lines_is_still_refused(
    sim: Simulator, tmp_path: Path
) -> None:
    """Fixing a rejected line while also changing a good one is another input."""
    inp = bad_input(tmp_path / "in.jsonl")
    assert go(sim, inp, tmp_path / "run") == 1
    rows = tasks(4)
    rows[3]["task"] = "something else entirely"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    with pytest.raises(RunDirError, match="not the input"):
        go(sim, inp, tmp_path / "run")


@pytest.mark.parametrize(
    ("failed", "bad", "hint", "absent"),
    [
        (2, 0, "--retry-failed", "fix them"),
        (0, 3, "fix them in the input, in place", "--retry-failed"),
        (1, 1, "--retry-failed", None),
    ],
)
def test_the_retry_failed_hint_only_where_it_applies(
    failed: int, bad: int, hint: str, absent: str | None
) -> None:
    """The end-of-run message offers --retry-failed for failed records, and says how to
    fix unreadable lines, each only when there are some."""
    state, code, message = conclude(Halting(), failed, bad)
    assert (state, code) == ("finished", 1)
    assert message is not None and hint in message
    if absent is not None:
        assert absent not in message
