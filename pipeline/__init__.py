"""refine: Self-Refine over large JSONL datasets, checkpointed, rate-limited and resumable."""

from .errors import (
    AuthError,
    CallError,
    ConfigError,
    FatalCallError,
    InputError,
    JobError,
    RefineError,
    RunDirError,
    RunLocked,
    StoreError,
    UnavailableError,
)
from .jobs import Job, builtin_jobs, load_job
from .runner import EXIT, RunSummary, Settings, arun, resume, run

__all__ = [
    "EXIT",
    "AuthError",
    "CallError",
    "ConfigError",
    "FatalCallError",
    "InputError",
    "Job",
    "JobError",
    "RefineError",
    "RunDirError",
    "RunLocked",
    "RunSummary",
    "Settings",
    "StoreError",
    "UnavailableError",
    "arun",
    "builtin_jobs",
    "load_job",
    "resume",
    "run",
]
