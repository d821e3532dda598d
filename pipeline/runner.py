"""Running a job over an input file into a run directory: ``pipeline.run`` and ``refine resume``.

Data flows one way: the reader streams records (bad lines to errors.jsonl) into
the pool; each record's loop asks the client for every call and hands each
completed call to the journal before its next step; a finished record goes to
outputs.jsonl and traces.jsonl. Resume is the journal replaying its steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from itertools import islice
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
from anyio.abc import ObjectSendStream

from .client import OpenAIClient
from .errors import (
    AuthError,
    ConfigError,
    FatalCallError,
    InputError,
    StoreError,
    UnavailableError,
)
from .jobs import Job, load_job
from .limits import Limiter
from .loop import ModelClient, Outcome, Step, refine_record
from .outputs import Outputs
from .pool import run_pool
from .progress import Counters, Progress
from .records import Record, count_lines, fingerprint, read_records, same_input
from .rundir import RunDir, now_iso, write_json_atomic
from .store import Journal

__all__ = ["EXIT", "RunSummary", "Settings", "arun", "resume", "run"]

log = logging.getLogger("refine")

# Exit statuses (documented in the README).
EXIT = {
    "ok": 0,  # every input line became a record and every record is done
    "partial": 1,  # some records failed, or some input lines could not be read
    "config": 2,  # bad usage or configuration (also: unknown model, RUN_DIR in use)
    "auth": 3,  # the endpoint refused the API key
    "store": 4,  # the run directory cannot be written (disk full, read-only)
    "unavailable": 5,  # the endpoint stayed down longer than --max-outage
    "interrupted": 130,  # SIGINT/SIGTERM: stopped cleanly, resumable
}
DEFAULT_TIMEOUT_S = 60.0
LOCAL_TIMEOUT_S = 900.0  # a local model on a few cores answers long prompts slowly
READ_BATCH = 256
PROGRESS_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class Settings:
    """How to run: everything but the job and the input."""

    model: str = "gpt-4o-mini"
    base_url: str | None = None
    max_iters: int | None = None  # None: the job's default
    min_iters: int = 0  # refinements before the critic's done (or a score) may stop a loop
    checks: bool = True  # run the job's check hook on every answer
    concurrency: int = 64
    rpm: float | None = None
    tpm: float | None = None
    timeout: float | None = None  # None: 60 s, or 900 s for a local model
    max_retries: int = 5
    max_outage: float = 300.0  # seconds an endpoint may keep failing before the run stops
    id_field: str = "id"
    limit: int | None = None
    local: bool = False
    local_model: str | None = None
    structured: str = "json_schema"  # first structured-output level to try
    fsync: bool = True


@dataclass(slots=True)
class RunSummary:
    """What a run did, and the exit status it maps to."""

    run_dir: Path
    counters: Counters
    exit_code: int = 0
    state: str = "finished"
    message: str | None = None
    outcome_counts: dict[str, int] = field(default_factory=dict)


def _clean_url(url: str | None) -> str | None:
    """A base URL fit for the manifest: credentials in it are dropped."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _version() -> str:
    try:
        return metadata.version("refine")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _manifest(
    job: Job, input_path: Path, settings: Settings, model: str, base_url: str | None, max_iters: int
) -> dict[str, Any]:
    shown = {
        k: v
        for k, v in asdict(settings).items()
        if k not in ("model", "base_url", "max_iters", "min_iters", "checks", "id_field")
    }
    return {
        "package": "refine",
        "version": _version(),
        "job": {"name": job.name, "hash": job.content_hash, "source": job.source},
        "model": model,
        "base_url": _clean_url(base_url),
        "max_iters": max_iters,
        "min_iters": settings.min_iters,
        "checks": settings.checks,
        "id_field": settings.id_field,
        "settings": shown,
        "input": {"path": str(input_path.resolve()), "fingerprint": fingerprint(input_path)},
    }


@contextlib.asynccontextmanager
async def _endpoint(
    settings: Settings, run_dir: Path
) -> AsyncIterator[tuple[str, str | None, int | None, str, dict[str, Any] | None]]:
    """(model name, base URL, slots, structured level, local model provenance) to use.

    Starts the local model's server for ``--local``; its errors are ConfigErrors (exit 2).
    """
    if not settings.local:
        yield (
            settings.model,
            settings.base_url or os.environ.get("OPENAI_BASE_URL"),
            None,
            settings.structured,
            None,
        )
        return
    from . import local  # the optional extra

    local.check_llama_cpp()  # before downloading hundreds of MB, not after
    # Resolving may download and hash the model: keep the event loop free.
    model = await anyio.to_thread.run_sync(local.resolve_model, settings.local_model)
    server = local.LocalServer(
        model, log_dir=run_dir, parallel=local.slots_for(settings.concurrency)
    )
    await server.__aenter__()
    try:
        yield server.model, server.base_url, server.parallel, server.structured, model.provenance()
    finally:
        with anyio.CancelScope(shield=True):
            await server.__aexit__(None, None, None)


async def arun(
    job: Job | str,
    input_path: str | Path,
    out_dir: str | Path,
    settings: Settings | None = None,
    *,
    api_key: str | None = None,
    client: ModelClient | None = None,
    show_progress: bool = True,
    install_signal_handlers: bool = False,
) -> RunSummary:
    """Run (or continue) ``job`` over ``input_path`` into ``out_dir``; async form of ``run``."""
    settings = settings or Settings()
    if isinstance(job, str):
        job = load_job(job)
    input_path = Path(input_path)
    if not input_path.is_file():
        raise ConfigError(f"input file not found: {input_path}")
    if settings.concurrency < 1:
        raise ConfigError("--concurrency must be >= 1")
    max_iters = job.max_iters if settings.max_iters is None else settings.max_iters
    if max_iters < 0:
        raise ConfigError("--max-iters must be >= 0")
    if not 0 <= settings.min_iters <= max_iters:
        raise ConfigError(f"--min-iters must be between 0 and --max-iters ({max_iters})")
    if api_key is None:
        api_key = os.environ.get("OPENAI_API_KEY")
    rd = RunDir(Path(out_dir))
    with rd.lock():
        async with _endpoint(settings, rd.path) as endpoint:
            model, base_url, parallel, structured, local_model = endpoint
            model_id = model if not settings.local else f"local:{model}"
            if client is None and not settings.local and not base_url and not api_key:
                raise ConfigError(
                    "OPENAI_API_KEY is not set (or give --base-url for a server "
                    "that needs no key, or --local)"
                )
            # the structured level actually tried first (the local server's, with --local)
            shown = replace(settings, structured=structured)
            manifest = _manifest(job, input_path, shown, model_id, base_url, max_iters)
            if local_model is not None:
                manifest["local_model"] = local_model  # file, SHA-256 and where it came from
            old = rd.read_manifest()
            if old is not None:
                rd.check_same(old, manifest)
                if not same_input(input_path, old["input"]["fingerprint"]):
                    raise ConfigError(
                        f"{input_path} is not the input of the run in {rd.path} "
                        f"(that was {old['input']['path']}; only appending records is allowed)"
                    )
                manifest["input"]["fingerprint"] = old["input"]["fingerprint"]
                manifest["created_at"] = old.get("created_at")
                manifest["runs"] = int(old.get("runs", 0)) + 1
            else:
                manifest["created_at"] = now_iso()
                manifest["runs"] = 1
            manifest.update(updated_at=now_iso(), state="running", exit_code=None)
            write_json_atomic(rd.manifest_path, manifest)

            real_client: OpenAIClient | None = None
            if client is None:
                real_client = OpenAIClient(
                    model=model,
                    base_url=base_url,
                    api_key=api_key,
                    timeout=settings.timeout
                    or (LOCAL_TIMEOUT_S if settings.local else DEFAULT_TIMEOUT_S),
                    max_retries=settings.max_retries,
                    limiter=Limiter(settings.rpm, settings.tpm),
                    concurrency=settings.concurrency,
                    structured=structured,
                    max_in_flight=parallel,
                    max_outage=settings.max_outage,
                )
                client = real_client
            try:
                summary = await _execute(
                    job,
                    input_path,
                    rd,
                    settings,
                    max_iters,
                    client,
                    real_client,
                    show_progress,
                    install_signal_handlers,
                )
            finally:
                if real_client is not None:
                    with anyio.CancelScope(shield=True):
                        await real_client.aclose()
            manifest.update(updated_at=now_iso(), state=summary.state, exit_code=summary.exit_code)
            with contextlib.suppress(StoreError):
                write_json_atomic(rd.manifest_path, manifest)
            return summary


async def _execute(
    job: Job,
    input_path: Path,
    rd: RunDir,
    settings: Settings,
    max_iters: int,
    client: ModelClient,
    real_client: OpenAIClient | None,
    show_progress: bool,
    install_signal_handlers: bool,
) -> RunSummary:
    def warn(message: str) -> None:
        log.warning("%s", message)

    outputs = Outputs(rd.path, warn)
    outputs.sync()  # what the journal may drop below must be on disk first
    journal = Journal(rd.checkpoint_path, fsync=settings.fsync)
    prior = journal.load(outputs.finished, warn)
    journal.open()

    counters = Counters(already=len(outputs.finished))
    total = await anyio.to_thread.run_sync(count_lines, input_path)
    counters.total = min(total, settings.limit) if settings.limit is not None else total
    progress = Progress(counters, enabled=show_progress)
    summary = RunSummary(rd.path, counters)
    stop: dict[str, BaseException] = {}

    async def produce(send: ObjectSendStream[Record]) -> None:
        items = read_records(input_path, job.inputs, settings.id_field)
        seen_records = 0
        while settings.limit is None or seen_records < settings.limit:
            batch: list[Record | InputError] = await anyio.to_thread.run_sync(
                lambda: list(islice(items, READ_BATCH))
            )
            if not batch:
                break
            for item in batch:
                if isinstance(item, InputError):
                    counters.bad_lines += 1
                    if counters.total is not None:
                        counters.total -= 1
                    outputs.bad_line(item)
                    continue
                seen_records += 1
                if item.id not in outputs.finished:
                    await send.send(item)
                if settings.limit is not None and seen_records >= settings.limit:
                    break

    sink = _CountingSink(journal, counters)

    async def work(record: Record) -> None:
        counters.in_flight += 1
        replayed = prior.pop(record.id, [])
        try:
            outcome: Outcome = await refine_record(
                record,
                job,
                client,
                sink,
                max_iters=max_iters,
                min_iters=settings.min_iters,
                checks=settings.checks,
                prior=replayed,
            )
        finally:
            counters.in_flight -= 1
        outputs.finish(outcome)
        if outcome.status == "done":
            counters.done += 1
        else:
            counters.failed += 1
            log.debug("record %s (line %d) failed: %s", record.id, record.line, outcome.error)

    async def main(scope: anyio.CancelScope) -> None:
        try:
            await run_pool(produce, work, settings.concurrency)
        except* FatalCallError as group:
            stop["fatal"] = group.exceptions[0]
        except* StoreError as group:
            stop["store"] = group.exceptions[0]
        scope.cancel()

    async def report() -> None:
        while True:
            _sync_client_counters(counters, real_client)
            progress.tick()
            rd.write_progress({"pid": os.getpid(), "state": "running", **counters.snapshot()})
            await anyio.sleep(PROGRESS_EVERY_S)

    async def signals(scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
            async for signum in received:
                stop["signal"] = KeyboardInterrupt(signal.Signals(signum).name)
                scope.cancel()
                return

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(journal.run)
            tg.start_soon(report)
            if install_signal_handlers:
                tg.start_soon(signals, tg.cancel_scope)
            await main(tg.cancel_scope)
    except (KeyboardInterrupt, anyio.get_cancelled_exc_class()):
        stop.setdefault("signal", KeyboardInterrupt("SIGINT"))
        raise
    finally:
        journal.close()
        _sync_client_counters(counters, real_client)
        progress.close()
        with contextlib.suppress(OSError):
            outputs.sync()
        outputs.close()
        summary.outcome_counts = dict(outputs.outputs.counts)
        _conclude(summary, stop, outputs)
        rd.write_progress({"pid": os.getpid(), "state": summary.state, **counters.snapshot()})
    return summary


class _CountingSink:
    """The journal, counting each saved call's tokens for live progress."""

    __slots__ = ("counters", "journal")

    def __init__(self, journal: Journal, counters: Counters) -> None:
        self.journal = journal
        self.counters = counters

    async def save(self, record_id: str, index: int, step: Step) -> None:
        await self.journal.save(record_id, index, step)
        self.counters.prompt_tokens += step.usage.get("prompt_tokens", 0)
        self.counters.completion_tokens += step.usage.get("completion_tokens", 0)


def _sync_client_counters(counters: Counters, client: OpenAIClient | None) -> None:
    if client is not None:
        counters.calls = client.calls
        counters.retries = client.retries
        counters.rate_limited = client.limiter.rate_limited


def _conclude(summary: RunSummary, stop: dict[str, BaseException], outputs: Outputs) -> None:
    failed = outputs.outputs.counts.get("failed", 0)
    bad = len(outputs.errors.keys)
    if "fatal" in stop:
        err = stop["fatal"]
        summary.state = "stopped"
        if isinstance(err, AuthError):
            summary.exit_code = EXIT["auth"]
        elif isinstance(err, UnavailableError):
            summary.exit_code = EXIT["unavailable"]
        else:
            summary.exit_code = EXIT["config"]
        summary.message = f"stopped: {err}"
    elif "store" in stop:
        summary.state = "stopped"
        summary.exit_code = EXIT["store"]
        summary.message = f"stopped: {stop['store']}"
    elif "signal" in stop:
        summary.state = "interrupted"
        summary.exit_code = EXIT["interrupted"]
        summary.message = (
            f"interrupted ({stop['signal']}); every completed call is saved: "
            "run the same command again, or `refine resume`, to continue"
        )
    elif failed or bad:
        summary.state = "finished"
        summary.exit_code = EXIT["partial"]
        summary.message = (
            f"finished with {failed} failed record(s) and {bad} unreadable "
            "input line(s) (see outputs.jsonl and errors.jsonl)"
        )
    else:
        summary.state = "finished"
        summary.exit_code = EXIT["ok"]


def run(
    job: Job | str,
    input_path: str | Path,
    out_dir: str | Path,
    settings: Settings | None = None,
    **kwargs: Any,
) -> RunSummary:
    """Run (or continue) ``job`` over ``input_path`` into ``out_dir``; see ``arun``."""
    return anyio.run(lambda: arun(job, input_path, out_dir, settings, **kwargs))


def settings_from_manifest(manifest: dict[str, Any]) -> Settings:
    """The settings a run directory was last run with (for ``refine resume``)."""
    stored = dict(manifest.get("settings", {}))
    known = {f for f in Settings.__dataclass_fields__}
    values = {k: v for k, v in stored.items() if k in known}
    model = manifest["model"]
    if values.get("local"):
        model = Settings().model
    return Settings(
        model=model,
        base_url=manifest.get("base_url") if not values.get("local") else None,
        max_iters=manifest.get("max_iters"),
        min_iters=manifest.get("min_iters", 0),
        checks=manifest.get("checks", True),
        id_field=manifest.get("id_field", "id"),
        **values,
    )


def resume(run_dir: str | Path, **kwargs: Any) -> RunSummary:
    """Continue the run in ``run_dir`` with the settings its manifest records."""
    rd = RunDir(Path(run_dir))
    manifest = rd.read_manifest()
    if manifest is None:
        raise ConfigError(f"{run_dir} holds no run (no manifest.json)")
    settings = settings_from_manifest(manifest)
    job_ref = manifest["job"]["source"]
    return run(job_ref, manifest["input"]["path"], rd.path, settings, **kwargs)
