"""``refine jobs [JOB]``: the built-in jobs and their input fields, or one job file checked.

Loading a job is its validation (``core.loader``): a file that does not load is refused
with the file, the key and, for a TOML syntax error, the line. Fields are marked by how a
record's value is used: shown to the model, read by the checks only, or a label (a
reference answer that measures and never chooses).
"""

from __future__ import annotations

from ..core.jobs import InputField, Job, builtin_jobs
from ..core.loader import load_job

__all__ = ["describe", "field_text", "listing"]

_USES = {
    "prompt": "shown to the model",
    "check": "check data: read by the checks only, never shown",
    "label": "label: read by the evaluator only (measures, never chooses or is shown)",
}


def field_text(f: InputField) -> str:
    """``name?`` (optional) with its type, and its use when it is not shown to the model."""
    use = "" if f.use == "prompt" else f", {f.use}"
    return f"{f.name}{'' if f.required else '?'} ({f.type}{use})"


def listing() -> str:
    """Every built-in job: its fields (labels marked), description and selection rules."""
    rows: list[str] = []
    for name, path in builtin_jobs().items():
        job = load_job(str(path))
        rows.append(f"{name:<20} {', '.join(field_text(f) for f in job.inputs)}")
        if job.description:
            rows.append(f"{'':<20} {job.description}")
        if job.answer_kind.selections:
            extra = ", ".join(job.answer_kind.selections)
            rows.append(f"{'':<20} selection rules beside the default: {extra}")
    rows.append("fields: NAME? is optional; label: a reference answer, check: data for the checks")
    return "\n".join(rows)


def describe(name_or_path: str) -> str:
    """One job, loaded (so checked): its fields, prompts' roles, hooks, stop rule, output."""
    job = load_job(name_or_path)
    rows = [f"{job.name}: {job.source} loads (content hash {job.content_hash[:12]})"]
    if job.description:
        rows.append(f"  {job.description}")
    rows.append("  input fields:")
    width = max((len(f.name) for f in job.inputs), default=0) + 1
    for f in job.inputs:
        need = "required" if f.required else "optional"
        desc = f"; {f.description}" if f.description else ""
        rows.append(f"    {f.name:<{width}} {f.type}, {need}, {_USES[f.use]}{desc}")
    rows.append(f"  hooks: {_hooks(job)}")
    if job.metrics:
        metrics = ", ".join(
            f"{name} ({spec.source}, {spec.better or 'no'} better)"
            for name, spec in job.metrics.items()
        )
        rows.append(f"  metrics declared: {metrics}")
    rows.append(f"  feedback: actions in {job.actions_field!r}, done in {job.done_field!r}"
                + (f", score in {job.score_field!r}" if job.score_field else ""))  # fmt: skip
    stop = f"at most {job.max_iters} refinement(s)"
    if job.score_threshold is not None:
        stop += f", or a score >= {job.score_threshold:g}"
    rows.append(f"  stop: the critic's done, {stop}")
    rows.append(f"  model: temperature {job.temperature:g}, max_tokens {job.max_tokens}")
    rows.append(f"  output: kind {job.answer_kind.name}, chosen by {job.select}")
    strategies = ", ".join(job.strategies.names) or "none"
    rows.append(f"  strategies: {strategies}; repair {'on' if job.strategies.repair else 'off'}")
    return "\n".join(rows)


def _hooks(job: Job) -> str:
    hooks = [
        name
        for name, hook in (("evaluate", job.evaluator), ("check", job.checker))
        if hook is not None
    ]
    return ", ".join(hooks) or "none"
