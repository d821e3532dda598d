"""``refine status``: what a run directory holds, readable while the run goes on."""

from __future__ import annotations

import contextlib
import fcntl
import time
from pathlib import Path
from typing import Any

import orjson

from .errors import ConfigError
from .records import count_lines
from .rundir import RunDir

__all__ = ["PRICES", "collect", "cost", "input_lines", "render"]

# USD per million tokens (input, output) for common hosted models; others show no cost.
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
}


def cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """Dollar cost of the tokens, when the model's price is known (local models cost 0)."""
    if model.startswith("local:"):
        return 0.0
    price = PRICES.get(model)
    if price is None:
        return None
    return round((prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6, 6)


def _active(rd: RunDir) -> bool:
    lock = rd.path / "lock"
    if not lock.exists():
        return False
    with lock.open("a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return False


def input_lines(path: Path) -> int | None:
    """Non-blank lines of a run's input, or None when it cannot be read any more."""
    try:
        return count_lines(path)
    except OSError:
        return None


def collect(run_dir: Path) -> dict[str, Any]:
    """Figures of a run: counts by status, tokens, cost, and live progress when running."""
    rd = RunDir(run_dir)
    manifest = rd.read_manifest()
    if manifest is None:
        raise ConfigError(f"{run_dir} holds no run (no manifest.json)")
    counts = {"done": 0, "failed": 0}
    tokens = {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0}
    seen: set[str] = set()
    out = rd.path / "outputs.jsonl"
    if out.exists():
        with out.open("rb") as fh:
            for raw in fh:
                try:
                    line = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    continue  # a line being written right now
                if line["id"] in seen:
                    continue
                seen.add(line["id"])
                counts[line["status"]] = counts.get(line["status"], 0) + 1
                for k in tokens:
                    tokens[k] += int((line.get("usage") or {}).get(k, 0))
    errs = rd.path / "errors.jsonl"
    bad = count_lines(errs) if errs.exists() else 0
    lines = input_lines(Path(manifest["input"]["path"]))
    limit = (manifest.get("settings") or {}).get("limit")
    total = None
    if lines is not None:
        total = lines - bad
        if limit is not None:
            total = min(total, limit)
    finished = counts["done"] + counts["failed"]
    progress = None
    with contextlib.suppress(OSError, orjson.JSONDecodeError):
        progress = orjson.loads(rd.progress_path.read_bytes())
    active = _active(rd)
    state = manifest.get("state")
    if active:
        state = "running"
    elif state == "running":
        state = "stopped (killed; resumable)"  # the process died without updating the manifest
    return {
        "run_dir": str(rd.path),
        "job": manifest["job"]["name"],
        "model": manifest["model"],
        "state": state,
        "records": total,
        "done": counts["done"],
        "failed": counts["failed"],
        "pending": None if total is None else max(0, total - finished),
        "bad_lines": bad,
        "in_flight": progress.get("in_flight") if active and progress else 0,
        "calls": tokens["calls"],
        "prompt_tokens": tokens["prompt_tokens"],
        "completion_tokens": tokens["completion_tokens"],
        "cost_usd": cost(manifest["model"], tokens["prompt_tokens"], tokens["completion_tokens"]),
        "live": progress if active else None,
        "updated_at": manifest.get("updated_at"),
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def render(info: dict[str, Any]) -> str:
    """Status as a few human lines."""
    cost_text = (
        "unknown (no price for this model)"
        if info["cost_usd"] is None
        else (f"${info['cost_usd']:.4f}")
    )
    lines = [
        f"run:      {info['run_dir']} ({info['state']})",
        f"job:      {info['job']}   model: {info['model']}",
        f"records:  {info['done']} done, {info['failed']} failed, {info['pending']} pending"
        f" of {info['records']}"
        + (f", {info['in_flight']} in flight" if info["in_flight"] else ""),
        f"input:    {info['bad_lines']} unreadable line(s) (errors.jsonl)",
        f"tokens:   {info['prompt_tokens']} prompt + {info['completion_tokens']} completion "
        f"in {info['calls']} calls of finished records",
        f"cost:     {cost_text}",
    ]
    live = info.get("live")
    if live:
        lines.append(
            f"live:     {live.get('calls', 0)} calls this session, "
            f"{live.get('calls_per_s', 0)} calls/s, {live.get('retries', 0)} retries, "
            f"{live.get('rate_limited', 0)} rate-limited"
        )
    return "\n".join(lines)
