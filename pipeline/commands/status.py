"""``refine status``: what a run directory holds, readable while the run goes on.

Finished records count from outputs.jsonl; records in flight or interrupted count from
the checkpoint journal, so every completed call and its tokens and dollars are included.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..backends.batch.ledger import read_ledger
from ..client.prices import price_book
from ..runs.journal import read_steps
from ..runs.rundir import RunDir
from ..runs.tally import tally_outputs

__all__ = ["collect", "render"]


def collect(run_dir: Path) -> dict[str, Any]:
    """Figures of a run: counts by status, calls, tokens, cost, and live progress when running."""
    rd = RunDir(run_dir)
    manifest = rd.require_manifest()
    prices = price_book(manifest.settings.prices, missing_ok=True)
    model_for = {"generate": manifest.model, "refine": manifest.model, "feedback": manifest.critic}
    t = tally_outputs(rd.outputs_path, prices, model_for)
    unfinished = read_steps(rd.journal_path, t.finished_ids)
    t.add_unfinished(unfinished, prices, model_for)
    expected = rd.expected(manifest)
    active = rd.is_locked()
    progress = rd.read_progress() if active else None
    state = manifest.state
    if active:
        state = "running"
    elif state == "running":
        state = "stopped (killed; resumable)"  # the process died without updating the manifest
    finished = t.done + t.failed
    total = expected.records
    if total is None and manifest.settings.shard is not None and state == "finished":
        total = finished  # a finished shard has read its whole share
    return {
        "run_dir": str(rd.path),
        "job": manifest.job.name,
        "model": manifest.model,
        "feedback_model": manifest.feedback_model,
        "state": state,
        "records": total,
        "input": expected.describe(),
        "input_lines": expected.input_lines,
        "limit": expected.limit,
        "shard": None
        if manifest.settings.shard is None
        else "/".join(str(x) for x in manifest.settings.shard),
        "done": t.done,
        "failed": t.failed,
        "pending": None if total is None else max(0, total - finished),
        "in_progress": t.in_progress,
        "bad_lines": expected.bad_lines,
        "in_flight": progress.get("in_flight", 0) if progress else 0,
        "calls": t.calls,
        "prompt_tokens": t.prompt_tokens,
        "cached_tokens": t.cached_tokens,
        "cache_write_tokens": t.cache_write_tokens,
        "completion_tokens": t.completion_tokens,
        "service_tier": manifest.settings.service_tier,
        "cost_usd": None if t.cost_usd is None else round(t.cost_usd, 6),
        "hook_errors": dict(t.hook_errors),
        "budget_usd": manifest.settings.budget,
        "batches": _batches(rd) if manifest.settings.batch else None,
        "live": progress,
        "updated_at": manifest.updated_at,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _batches(rd: RunDir) -> dict[str, Any]:
    """``--batch``: the batches the ledger holds open, by what is left to do with them."""
    entries = read_ledger(rd.batches_path).entries.values()
    return {
        "in_flight": [e.batch_id for e in entries if e.live],
        "unconfirmed": sum(1 for e in entries if e.batch_id is None),
        "cancel_requested": sum(1 for e in entries if e.cancelled and e.live),
    }


def _cached(info: dict[str, Any]) -> str:
    """The prompt tokens served from the provider's cache, and their share."""
    cached, prompt = info.get("cached_tokens", 0), info["prompt_tokens"]
    share = f", {cached / prompt:.0%}" if prompt else ""
    text = f"{cached} cached{share}, at the cached price"
    written = info.get("cache_write_tokens", 0)
    if written:  # a provider that bills writing its cache (Anthropic's)
        text += f"; {written} written to the cache, at the cache-write price"
    return text


def render(info: dict[str, Any]) -> str:
    """Status as a few human lines."""
    if info["cost_usd"] is None:
        cost_text = "unknown (no price for a model of this run; see --prices)"
    else:
        cost_text = f"${info['cost_usd']:.4f}"
    if info["budget_usd"] is not None:
        cost_text += f" of --budget ${info['budget_usd']:g}"
    models = info["model"]
    if info["feedback_model"]:
        models += f" (critic: {info['feedback_model']})"
    scope = info["input"] + (f", shard {info['shard']}" if info["shard"] else "")
    records = "?" if info["records"] is None else str(info["records"])
    lines = [
        f"run:      {info['run_dir']} ({info['state']})",
        f"job:      {info['job']}   model: {models}",
        f"input:    {scope}; {info['bad_lines']} unreadable (errors.jsonl)",
        f"records:  {info['done']} done, {info['failed']} failed, {info['pending']} pending"
        f" of {records}"
        + (f", {info['in_progress']} part-way" if info["in_progress"] else "")
        + (f", {info['in_flight']} in flight" if info["in_flight"] else ""),
        f"tokens:   {info['prompt_tokens']} prompt ({_cached(info)}) + "
        f"{info['completion_tokens']} completion in {info['calls']} calls (checkpointed, "
        "in-flight records included)",
        f"cost:     {cost_text}"
        + (f" (service tier: {info['service_tier']})" if info.get("service_tier") else ""),
    ]
    hooks = info.get("hook_errors") or {}
    if hooks:
        failed = ", ".join(f"{h} failed on {n} answer(s)" for h, n in sorted(hooks.items()))
        lines.append(f"hooks:    {failed} (raised or broke its contract; traces: hook_errors)")
    batches = info.get("batches")
    if batches is not None:
        ids = batches["in_flight"]
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        lines.append(
            f"batches:  {len(ids)} in flight"
            + (f" ({shown})" if ids else "")
            + (f", {batches['unconfirmed']} being created" if batches["unconfirmed"] else "")
            + (f", {batches['cancel_requested']} cancelling" if batches["cancel_requested"] else "")
        )
    live = info.get("live")
    if live:
        lines.append(
            f"live:     {live.get('calls', 0)} calls this session, "
            f"{live.get('calls_per_s', 0)} calls/s, {live.get('retries', 0)} retries, "
            f"{live.get('rate_limited', 0)} rate-limited"
        )
        workers = live.get("workers") or ()
        if workers:
            lines.append(
                "workers:  "
                + ", ".join(
                    f"{w['worker']}: pid {w['pid']} on {w['node']}, {w['records']} records"
                    + (f", {w['restarts']} restarts" if w["restarts"] else "")
                    + ("" if w["alive"] else " (given up)")
                    for w in workers
                )
            )
    return "\n".join(lines)
