"""One run's machinery: what any driver needs to run records into a run directory.

::

    settings    Settings: how a run proceeds (flags), resolved; the job as they change it
    manifest    what a run directory holds a run of, and which invocations continue it
    urls        where a run's calls go: its endpoints, kept between invocations
    restart     a run with no successful call, started over by a corrected command
    rundir      the run directory's files, lock and progress snapshot
    journal     the checkpoint journal: the source of truth for resume, compacted
    outputs     outputs.jsonl, traces.jsonl, errors.jsonl
    traces      a record's calls read back, each request rebuilt as sent
    tally       what a run has used: records, calls, tokens, dollars
    progress    the progress bar, or log lines where there is no terminal
    shards      --shard I/N
    clients     where each side of the loop is served, and opening a client there
    session     Session: one invocation (files, counters, budget, stop state, records)
    exits       the exit status of a command, by what happened
    hooks       the watch on a job's hooks: failures counted, a broken hook stops the run

Backends (``pipeline.backends``) build on these public types; nothing here knows a backend.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .clients import ClientPlan, Endpoint, open_client
    from .manifest import Manifest
    from .rundir import RunDir
    from .session import EXIT, CallCounts, Halt, RunSummary, Session
    from .settings import Settings, effective_job, resolve

# Imported when first asked for (PEP 562): a reader of one file (refine status, show)
# need not load the session and the client machinery.
_LAZY = {
    **dict.fromkeys(("ClientPlan", "Endpoint", "open_client"), ".clients"),
    "Manifest": ".manifest",
    "RunDir": ".rundir",
    **dict.fromkeys(("EXIT", "CallCounts", "Halt", "RunSummary", "Session"), ".session"),
    **dict.fromkeys(("Settings", "effective_job", "resolve"), ".settings"),
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)


__all__ = [
    "EXIT",
    "CallCounts",
    "ClientPlan",
    "Endpoint",
    "Halt",
    "Manifest",
    "RunDir",
    "RunSummary",
    "Session",
    "Settings",
    "effective_job",
    "open_client",
    "resolve",
]
