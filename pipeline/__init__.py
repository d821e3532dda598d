"""refine: Self-Refine over large datasets, checkpointed, rate-limited, paid for and resumable.

The layout, one concept per module (data flows top to bottom)::

    inputs       input formats, streamed: JSONL (gzip, bzip2, xz, zstd), Parquet, CSV
    records      reading input into records; bad lines become errors
    jobs         job files: prompts, feedback schema, stop rule, hooks
    settings     how a run proceeds (flags), and the values in force
    manifest     what a run directory holds a run of (typed, with its identity)
    rundir       the run directory's files, lock and progress snapshot
    calls        the record of a call: Completion, Step, Outcome, the ModelClient protocol
    loop         Self-Refine for one record: plan, the next call, the step it makes
    answers      the artifact in an answer: code, its tests, one sentence
    feedback     tolerant parsing of the critic's JSON, and rendering it for prompts
    pool         up to --concurrency records in flight
    client       one OpenAI-compatible call, composed of:
      retry        the retry policy (pure) and backoff
      outage       the per-endpoint breaker
      formats      the structured-output ladder
      endpoints    several replicas of a model
      limits       request and token pacing (GCRA)
      budget       the spending cap (reserve, then settle)
    prices       dollars per million tokens by model
    estimate     `refine estimate`: calls, tokens and dollars before a run
    store        the checkpoint journal (source of truth for resume)
    outputs      outputs.jsonl, traces.jsonl, errors.jsonl
    tally        what a run has used: records, calls, tokens, dollars
    progress     the progress bar / log lines
    shards       --shard I/N
    merge        `refine merge`: the shards' run directories as one run
    runner       pipeline.run / arun / resume: a Session driven by the pool (real time)
    cluster      --workers N: the Ray driver and worker actors, one rate limit and budget
    batch        --batch: the same Session driven through /v1/batches in rounds; its ledger;
                 `refine cancel`
    status       `refine status`
    report       `refine report` (Markdown, HTML)
    export       `refine export`: outputs (and input columns) as Parquet, CSV or JSONL
    sandbox      running programs in an isolated interpreter
    local        the embedded llama.cpp model (optional extra)
    cli          the command line: parses arguments and calls the above
    testing      the OpenAI-compatible simulator used by tests and benchmarks

Internal modules (anything not exported below) may change between versions.
"""

from .budget import Budget
from .core import Completion, Job, ModelClient, Outcome, Step, builtin_jobs, load_job
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
    StoreError,
    UnavailableError,
)
from .manifest import Manifest
from .prices import Price, PriceBook, load_prices
from .rundir import RunDir
from .runner import EXIT, RunSummary, aresume, arun, resume, run
from .settings import Settings
from .status import collect as run_status
from .status import render as render_status

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
    "Settings",
    "Step",
    "StoreError",
    "UnavailableError",
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
