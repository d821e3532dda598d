"""refine: Self-Refine over large datasets, checkpointed, rate-limited, paid for and resumable.

The package in layers, top to bottom; each imports only the layers below it (the same
order as docs/architecture.md and ``LAYERS`` in tests/test_architecture.py)::

    cli         the command line: parses arguments, calls the library          (top)
    commands    refine status, estimate, calibrate, export, merge, jobs, cancel,
                sandbox
    report      refine report: Markdown and one offline HTML page
    runner      pipeline.run / arun / resume: the composition root; looks up the
                backend the settings name and hands it the session
    backends    how records are driven, each chosen by name: realtime (the pool),
                batch (--batch, the Batch API), ray (--workers)
    serving     endpoints a run can call: the embedded llama.cpp model (--local)
    runs        one run's machinery: settings, manifest, run directory, journal,
                outputs, progress, endpoints, session
    io          input formats and records in; export and merge out
    client      one OpenAI-compatible call: retries, outages, formats, pacing,
                replicas, prices, budget, model ids
    sandbox     model-written Python in a child the kernel confines (Landlock, seccomp)
    core        the Self-Refine fold, job-agnostic: records, steps, jobs, kinds of
                answer, strategies, prompts, feedback, choice, the loop
    errors      the one error tree                                         (bottom)

Beside them, ``testing`` holds the OpenAI-compatible simulator used by tests and
benchmarks. Jobs (prompts, schema, stop rule, hooks) live in the top-level ``jobs``
package; the code-with-tests kit that only code jobs use is ``jobs.code``. Internal
modules (anything not exported below) may change between versions.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    AuthError,
    BudgetReached,
    CallError,
    ConfigError,
    FatalCallError,
    FeedbackParseError,
    InputError,
    JobError,
    RefineError,
    RunDirError,
    RunLocked,
    SandboxError,
    StoreError,
    UnavailableError,
    UnreachableError,
)

if TYPE_CHECKING:
    from .client.budget import Budget
    from .client.prices import Price, PriceBook, load_prices
    from .commands.status import collect as run_status
    from .commands.status import render as render_status
    from .core import Completion, Job, ModelClient, Outcome, Step, builtin_jobs, load_job
    from .runner import EXIT, RunSummary, aresume, arun, resume, run
    from .runs.manifest import Manifest
    from .runs.rundir import RunDir
    from .runs.settings import Settings
    from .sandbox import SandboxMode

# The rest is imported when first asked for (PEP 562), so ``import pipeline.cli`` for a
# command that calls no model (status, show, report, export, jobs, --help) loads only
# what that command needs: never the runner, whose backends bring the HTTP SDKs.
_LAZY: dict[str, tuple[str, str]] = {
    "Budget": (".client.budget", "Budget"),
    **{n: (".client.prices", n) for n in ("Price", "PriceBook", "load_prices")},
    "run_status": (".commands.status", "collect"),
    "render_status": (".commands.status", "render"),
    **{
        n: (".core", n)
        for n in ("Completion", "Job", "ModelClient", "Outcome", "Step", "builtin_jobs", "load_job")
    },
    **{n: (".runner", n) for n in ("EXIT", "RunSummary", "aresume", "arun", "resume", "run")},
    "Manifest": (".runs.manifest", "Manifest"),
    "RunDir": (".runs.rundir", "RunDir"),
    "Settings": (".runs.settings", "Settings"),
    "SandboxMode": (".sandbox", "SandboxMode"),
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0], __name__), where[1])
    globals()[name] = value  # asked once
    return value


__all__ = [
    "EXIT",
    "AuthError",
    "Budget",
    "BudgetReached",
    "CallError",
    "Completion",
    "ConfigError",
    "FatalCallError",
    "FeedbackParseError",
    "InputError",
    "Job",
    "JobError",
    "Manifest",
    "ModelClient",
    "Outcome",
    "Price",
    "PriceBook",
    "RefineError",
    "RunDir",
    "RunDirError",
    "RunLocked",
    "RunSummary",
    "SandboxError",
    "SandboxMode",
    "Settings",
    "Step",
    "StoreError",
    "UnavailableError",
    "UnreachableError",
    "aresume",
    "arun",
    "builtin_jobs",
    "load_job",
    "load_prices",
    "render_status",
    "resume",
    "run",
    "run_status",
]
