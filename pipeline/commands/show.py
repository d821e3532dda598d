"""``refine show RUN_DIR ID``: one record's calls in order, each with its messages as sent.

A finished record's calls come from traces.jsonl, a record still in flight (or stopped
part-way) from the journal; either way each call's request is rebuilt exactly as it went
to the model (``runs.traces``). ``--json`` prints one JSON object per call, whose
``messages`` is the request body's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..core.steps import Step
from ..errors import ConfigError
from ..runs.rundir import RunDir
from ..runs.traces import RecordTrace, find_trace

__all__ = ["call_json", "json_lines", "render", "show"]

_LINE = "─" * 72


def show(run_dir: Path, record_id: str) -> RecordTrace:
    """The calls of record ``record_id`` of the run in ``run_dir``.

    Raises ConfigError when the directory is no run's or the run has no call of it.
    """
    rd = RunDir(run_dir)
    rd.require_manifest()
    found = find_trace(rd, record_id)
    if found is None:
        raise ConfigError(f"{run_dir}: no call of record {record_id!r} (finished or in flight)")
    return found


def call_json(trace: RecordTrace, index: int) -> dict[str, Any]:
    """Call ``index`` of a record as one JSON object: where it stands, what it sent, what
    came back."""
    step = trace.steps[index]
    d: dict[str, Any] = {
        "id": trace.record_id,
        "call": index,
        "finished": trace.finished,
        **step.to_dict({"messages": step.messages}),
    }
    if trace.chosen == index:
        d["chosen"] = True
    return d


def _call_text(trace: RecordTrace, index: int, step: Step) -> str:
    marks = ["chosen"] if trace.chosen == index else []
    if step.error is not None:
        marks.append(f"error {step.error.get('type')}: {step.error.get('message')}")
    head = (
        f"call {index}: {step.role} ({step.call_kind}), iteration {step.iteration}, "
        f"model {step.model or '-'}, "
        f"{step.usage.get('prompt_tokens', 0):,} prompt + "
        f"{step.usage.get('completion_tokens', 0):,} completion tokens"
        + "".join(f"; {m}" for m in marks)
    )
    turns = [f"[{m['role']}]\n{m['content']}" for m in step.messages]
    answer = "(no answer)" if step.response is None else step.response
    return "\n".join([_LINE, head, _LINE, *turns, "[answer]", answer])


def render(trace: RecordTrace) -> str:
    """A record's calls as text: each call's head, then its messages and the answer."""
    where = "finished" if trace.finished else "not finished (from the journal)"
    calls = [_call_text(trace, i, s) for i, s in enumerate(trace.steps)]
    return "\n".join([f"record {trace.record_id}: {len(trace.steps)} call(s), {where}", *calls])


def json_lines(trace: RecordTrace) -> bytes:
    """``--json``: one object per call, one per line."""
    return b"".join(orjson.dumps(call_json(trace, i)) + b"\n" for i in range(len(trace.steps)))
