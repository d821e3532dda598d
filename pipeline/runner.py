"""Running a job over an input into a run directory: ``pipeline.run``, ``arun`` and ``resume``.

Data flows one way: the reader streams records (bad lines to errors.jsonl) to a driver
that runs each record's loop; every completed call goes to the journal before the loop
moves on; a finished record goes to outputs.jsonl and traces.jsonl. Resume is the
journal replaying its steps. The driver is the worker pool here (real-time calls); the
Batch API and Ray drivers run the same loop over the same ``Session``.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import ObjectSendStream

from .budget import Budget, Spending
from .client import OpenAIClient
from .core.jobs import Job
from .core.loader import load_job
from .core.loop import Policy, refine_record
from .core.records import Record
from .core.steps import ModelClient, Outcome, Step
from .errors import (
    AuthError,
    BudgetReached,
    ConfigError,
    FatalCallError,
    InputError,
    StoreError,
    UnavailableError,
)
from .inputs import check_input
from .limits import Limiter, RateLimiter
from .manifest import InputInfo, JobInfo, Manifest, clean_url, refuse_different
from .outputs import Outputs
from .pool import run_pool
from .prices import PriceBook, price_book
from .progress import Counters, Progress
from .records import count_records, fingerprint, read_records, same_input
from .rundir import RunDir
from .settings import Settings, effective_job, resolve
from .shards import shard_of
from .store import Journal
from .tally import tally

if TYPE_CHECKING:
    from .batch import BatchClients

__all__ = ["EXIT", "RunSummary", "Session", "Settings", "StopReason", "arun", "resume", "run"]

log = logging.getLogger("refine")

# Exit statuses (documented in the README and `refine --help`).
EXIT = {
    "ok": 0,  # every input line became a record and every record is done
    "partial": 1,  # some records failed, or some input lines could not be read
    "config": 2,  # bad usage or configuration (also: unknown model, RUN_DIR in use)
    "auth": 3,  # the endpoint refused the API key
    "store": 4,  # the run directory cannot be written (disk full, read-only)
    "unavailable": 5,  # the endpoint stayed down longer than --max-outage
    "budget": 6,  # --budget reached; resumable with a larger budget
    "detached": 75,  # --batch --detach: batches in flight; run the same command again
    "interrupted": 130,  # SIGINT/SIGTERM: stopped cleanly, resumable
}
READ_BATCH = 256
PROGRESS_EVERY_S = 1.0


class StopReason(enum.Enum):
    """Why a run stopped before finishing its records, with the exit status it maps to."""

    AUTH = "auth"
    UNAVAILABLE = "unavailable"
    FATAL = "config"  # an error every record would hit (unknown model, wrong URL)
    STORE = "store"
    BUDGET = "budget"
    DETACHED = "detached"
    SIGNAL = "interrupted"

    @property
    def exit_code(self) -> int:
        """The process exit status."""
        return EXIT[self.value]


@dataclass(slots=True)
class RunSummary:
    """What a run did, and the exit status it maps to."""

    run_dir: Path
    counters: Counters
    exit_code: int = 0
    state: str = "finished"
    message: str | None = None


@dataclass(slots=True)
class Stopping:
    """The first reason the run was told to stop, and the error that said so."""

    reason: StopReason | None = None
    error: BaseException | None = None

    def set(self, reason: StopReason, error: BaseException) -> None:
        """Record a reason to stop; the first one wins."""
        if self.reason is None:
            self.reason, self.error = reason, error

    @property
    def stopping(self) -> bool:
        """Whether the run has been told to stop."""
        return self.reason is not None


def stop_reason_of(err: BaseException) -> StopReason:
    """The stop reason an error that ends the run maps to."""
    if isinstance(err, AuthError):
        return StopReason.AUTH
    if isinstance(err, UnavailableError):
        return StopReason.UNAVAILABLE
    if isinstance(err, StoreError):
        return StopReason.STORE
    if isinstance(err, BudgetReached):
        return StopReason.BUDGET
    return StopReason.FATAL


def conclude(stop: Stopping, failed: int, bad: int) -> tuple[str, int, str | None]:
    """The run's final state, exit status and message."""
    reason, err = stop.reason, stop.error
    if reason is StopReason.SIGNAL:
        return (
            "interrupted",
            reason.exit_code,
            f"interrupted ({err}); every completed call is saved: "
            "run the same command again, or `refine resume`, to continue",
        )
    if reason is StopReason.BUDGET:
        return "stopped", reason.exit_code, f"stopped: {err}"
    if reason is StopReason.DETACHED:
        return "waiting", reason.exit_code, str(err)
    if reason is not None:
        return "stopped", reason.exit_code, f"stopped: {err}"
    if failed or bad:
        return (
            "finished",
            EXIT["partial"],
            f"finished with {failed} failed record(s) and {bad} unreadable input line(s) "
            "(see outputs.jsonl and errors.jsonl; `--retry-failed` runs the failed ones again)",
        )
    return "finished", EXIT["ok"], None


class Models:
    """The run's model clients: the generator's and, when it is another model, the critic's.

    With ``--batch`` the calls go through ``batch`` (the Batch API endpoints) instead; on
    Ray (``--workers``) each worker opens its own clients from ``plan``, and their figures
    arrive in ``remote``.
    """

    __slots__ = ("batch", "critic", "generator", "owned", "plan", "remote")

    def __init__(
        self,
        generator: ModelClient,
        critic: ModelClient | None = None,
        owned: tuple[OpenAIClient, ...] = (),
        batch: BatchClients | None = None,
    ) -> None:
        self.generator = generator
        self.critic = critic
        self.owned = owned  # the clients this run opened (and closes)
        self.batch = batch  # closed with the others
        self.plan: ClientPlan | None = None
        self.remote = (0, 0, 0)  # calls, retries and 429s of clients in other processes (Ray)

    def stats(self) -> tuple[int, int, int]:
        """Calls, retries and 429s of the clients this run opened (batch lines count as calls),
        here and on Ray workers."""
        calls, retries, limited = self.batch.stats() if self.batch is not None else self.remote
        return (
            calls + sum(c.calls for c in self.owned),
            retries + sum(c.retries for c in self.owned),
            limited + sum(c.limiter.rate_limited for c in self.owned),
        )

    async def aclose(self) -> None:
        """Close the HTTP connections of the clients this run opened."""
        with anyio.CancelScope(shield=True):
            for c in self.owned:
                await c.aclose()
            if self.batch is not None:
                await self.batch.aclose()


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """Where one side of the loop (generator or critic) is served."""

    model: str  # the name sent in requests
    model_id: str  # the name recorded: ``local:NAME`` for the embedded model
    urls: tuple[str, ...]
    structured: str
    slots: int | None  # requests the server computes at once (a local server), else None
    provenance: dict[str, Any] | None = None  # a local model's file, SHA-256 and origin
    grammar: bool = False  # a grammar enforces the schema, unseen by the model (a local server)


@dataclass(frozen=True, slots=True)
class ClientPlan:
    """How to open the run's clients in another process (a Ray worker)."""

    generator: _Endpoint
    critic: _Endpoint | None
    api_key: str | None = field(repr=False)  # travels by call argument, never in a repr or log


class Session:
    """One invocation of a run: its files, counters, budget, stop state and record stream."""

    def __init__(
        self,
        job: Job,
        input_path: Path,
        rd: RunDir,
        manifest: Manifest,
        prices: PriceBook,
        show_progress: bool,
    ) -> None:
        self.job = job
        self.input_path = input_path
        self.rd = rd
        self.manifest = manifest
        self.settings = manifest.settings
        self.policy = Policy(
            self.settings.max_iters or 0, self.settings.min_iters, self.settings.checks
        )
        self.prices = prices
        self.model_for = {
            "generate": manifest.model,
            "refine": manifest.model,
            "feedback": manifest.critic,
        }
        self.stop = Stopping()
        self.outputs = Outputs(rd.path, log.warning)
        self.outputs.sync()  # what the journal may drop below must be on disk first
        self.journal = Journal(rd.checkpoint_path, fsync=self.settings.fsync)
        done = self.outputs.finished - self._reopen_failed()
        self.prior = self.journal.load(done, log.warning)
        self.journal.open()
        used = tally(rd.outputs_path, self.prior, prices, self.model_for)
        self.budget = Budget(self.settings.budget, prices, spent=used.cost_usd or 0.0)
        self.budget.unknown = used.cost_usd is None
        self.counters = Counters(already=len(self.outputs.finished))
        self.progress = Progress(self.counters, enabled=show_progress)
        self.live: dict[str, Any] = {}  # a driver's own live figures for progress.json
        self._lines_seen = 0

    def _reopen_failed(self) -> set[str]:
        """With --retry-failed: take the failed records back (their journaled steps stay)."""
        if not self.settings.retry_failed:
            return set()
        ids = self.outputs.failed_ids()
        if ids:
            self.outputs.reopen(ids)
            log.info("retrying %d failed record(s) from their last completed call", len(ids))
        return ids

    def sink(self) -> _CountingSink:
        """Where loops save their steps."""
        return _CountingSink(self.journal, self.counters)

    def take_prior(self, record_id: str) -> list[Step]:
        """The journaled steps of a record (given once: the loop owns them after)."""
        return self.prior.pop(record_id, [])

    def finish(self, outcome: Outcome) -> None:
        """Write a finished record and count it."""
        cost = self.prices.steps_cost(outcome.steps, self.model_for)
        self.outputs.finish(outcome, cost)
        if outcome.status == "done":
            self.counters.done += 1
        else:
            self.counters.failed += 1
            log.debug(
                "record %s (line %d) failed: %s",
                outcome.record.id,
                outcome.record.line,
                outcome.error,
            )

    async def records(self, send: Callable[[Record], Awaitable[None]]) -> None:
        """Stream the records this invocation runs to ``send``; bad lines go to errors.jsonl.

        Records already finished are skipped, as are records of other shards and lines
        past ``--limit`` (which counts input lines, readable or not).
        """
        s = self.settings
        items = read_records(self.input_path, self.job.inputs, s.id_field)
        while not self.stop.stopping:
            batch: list[Record | InputError] = await anyio.to_thread.run_sync(
                lambda: list(islice(items, READ_BATCH))
            )
            if not batch:
                break
            for item in batch:
                if s.limit is not None and self._lines_seen >= s.limit:
                    return
                self._lines_seen += 1
                if isinstance(item, InputError):
                    self.counters.bad_lines += 1
                    self.outputs.bad_line(item)
                    continue
                if s.shard is not None and shard_of(item.id, s.shard[1]) != s.shard[0]:
                    continue
                if item.id in self.outputs.finished:
                    continue
                await send(item)
                if self.stop.stopping:
                    return

    async def count_input(self) -> None:
        """Set the progress total once the input is counted (runs beside the records)."""
        try:
            # check_cancelled: the count of a large input stops when the run ends.
            lines = await anyio.to_thread.run_sync(
                count_records, self.input_path, anyio.from_thread.check_cancelled
            )
        except (OSError, ConfigError) as err:
            log.warning("cannot count the lines of %s: %s", self.input_path, err)
            return
        if self.settings.limit is not None:
            lines = min(lines, self.settings.limit)
        if self.settings.shard is None:
            self.counters.lines = lines

    def publish(self, models: Models) -> None:
        """Refresh the live figures: the progress display and progress.json."""
        c = self.counters
        c.calls, c.retries, c.rate_limited = models.stats()
        c.spent_usd = self.budget.total()
        self.progress.tick()
        self.rd.write_progress(
            {"pid": os.getpid(), "state": "running", **c.snapshot(), **self.live}
        )

    async def supervise(
        self, models: Models, scope: anyio.CancelScope, install_signal_handlers: bool
    ) -> None:
        """Publish progress every second; with signal handlers, stop cleanly on SIGINT/SIGTERM."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.count_input)
            if install_signal_handlers:
                tg.start_soon(self._signals, scope)
            while True:
                self.publish(models)
                await anyio.sleep(PROGRESS_EVERY_S)

    async def _signals(self, scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
            async for signum in received:
                self.stop.set(StopReason.SIGNAL, KeyboardInterrupt(signal.Signals(signum).name))
                scope.cancel()
                return

    def close(self, models: Models) -> RunSummary:
        """Flush and close the files; the summary of this invocation."""
        self.journal.close()
        c = self.counters
        c.calls, c.retries, c.rate_limited = models.stats()
        c.spent_usd = self.budget.total()
        self.progress.close()
        with contextlib.suppress(StoreError):
            self.outputs.sync()
        self.outputs.close()
        failed = self.outputs.outputs.counts.get("failed", 0)
        bad = len(self.outputs.errors.keys)
        state, code, message = conclude(self.stop, failed, bad)
        self.rd.write_progress({"pid": os.getpid(), "state": state, **c.snapshot(), **self.live})
        return RunSummary(self.rd.path, c, code, state, message)


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


async def run_realtime(session: Session, models: Models) -> None:
    """The real-time driver: up to ``--concurrency`` records in flight through the pool."""

    async def produce(send: ObjectSendStream[Record]) -> None:
        await session.records(send.send)

    async def work(record: Record) -> None:
        session.counters.in_flight += 1
        try:
            outcome = await refine_record(
                record,
                session.job,
                models.generator,
                session.sink(),
                session.policy,
                critic=models.critic,
                prior=session.take_prior(record.id),
            )
        except BudgetReached as err:
            session.stop.set(StopReason.BUDGET, err)  # the record stays pending
            return
        finally:
            session.counters.in_flight -= 1
        session.finish(outcome)

    try:
        await run_pool(produce, work, session.settings.concurrency)
    except* (FatalCallError, StoreError) as group:
        err = group.exceptions[0]
        session.stop.set(stop_reason_of(err), err)


Driver = Callable[[Session, Models], Awaitable[None]]


def _driver(settings: Settings) -> Driver:
    if settings.batch:
        from .batch import check_settings, run_batches

        check_settings(settings)
        return run_batches
    if settings.workers is not None:
        from .cluster import ray_driver  # Ray is an optional extra

        return ray_driver()
    return run_realtime


async def _execute(
    session: Session, models: Models, driver: Driver, install_signal_handlers: bool
) -> RunSummary:
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.journal.run)
            tg.start_soon(session.supervise, models, tg.cancel_scope, install_signal_handlers)
            await driver(session, models)
            tg.cancel_scope.cancel()
    except (KeyboardInterrupt, anyio.get_cancelled_exc_class()):
        session.stop.set(StopReason.SIGNAL, KeyboardInterrupt("SIGINT"))
        raise
    finally:
        summary = session.close(models)
    return summary


def _resolve_endpoint(settings: Settings) -> _Endpoint:
    return _Endpoint(
        settings.model, settings.model, settings.base_urls(), settings.structured, None
    )


@contextlib.asynccontextmanager
async def _local_server(
    name: str | None, run_dir: Path, concurrency: int
) -> AsyncIterator[_Endpoint]:
    """Start llama.cpp's server for a local model; its errors are ConfigErrors (exit 2)."""
    from . import local

    local.check_llama_cpp()  # before downloading hundreds of MB, not after
    # Resolving may download and hash the model: keep the event loop free.
    model = await anyio.to_thread.run_sync(local.resolve_model, name)
    server = local.LocalServer(model, log_dir=run_dir, parallel=local.slots_for(concurrency))
    await server.__aenter__()
    try:
        yield _Endpoint(
            server.model,
            f"local:{server.model}",
            (server.base_url,),
            server.structured,
            server.parallel,
            model.provenance(),
            server.grammar,
        )
    finally:
        with anyio.CancelScope(shield=True):
            await server.__aexit__(None, None, None)


@contextlib.asynccontextmanager
async def _endpoints(
    settings: Settings, run_dir: Path
) -> AsyncIterator[tuple[_Endpoint, _Endpoint | None]]:
    """Where the generator and the critic are served; starts local models as needed."""
    async with contextlib.AsyncExitStack() as stack:
        if settings.local:
            generator = await stack.enter_async_context(
                _local_server(settings.local_model, run_dir, settings.concurrency)
            )
        else:
            generator = _resolve_endpoint(settings)
        critic: _Endpoint | None = None
        if settings.critic_is_local:
            name = settings.critic_local_model
            same = settings.local and (name is None or name == settings.local_model)
            critic = (
                generator
                if same
                else await stack.enter_async_context(
                    _local_server(name, run_dir, settings.concurrency)
                )
            )
        elif settings.feedback_model is not None:
            urls = (
                (settings.feedback_base_url,)
                if settings.feedback_base_url
                else (() if settings.local else generator.urls)
            )
            critic = _Endpoint(
                settings.feedback_model, settings.feedback_model, urls, settings.structured, None
            )
        if critic is not None and critic.model_id == generator.model_id:
            critic = None  # the critic is the generator
        yield generator, critic


def _open_client(
    endpoint: _Endpoint,
    settings: Settings,
    api_key: str | None,
    budget: Spending,
    limiter: RateLimiter | None = None,
) -> OpenAIClient:
    return OpenAIClient(
        model=endpoint.model_id,
        request_model=endpoint.model,
        base_url=endpoint.urls or None,
        api_key=api_key,
        timeout=settings.timeout or 0.0,
        max_retries=settings.max_retries,
        limiter=limiter or Limiter(settings.rpm, settings.tpm),
        concurrency=settings.concurrency,
        structured=endpoint.structured,
        grammar=endpoint.grammar,
        max_in_flight=endpoint.slots,
        max_outage=settings.max_outage,
        budget=budget,
    )


def _batch_clients(
    settings: Settings, api_key: str | None, generator: _Endpoint, critic: _Endpoint | None
) -> BatchClients:
    from .batch import open_clients

    def side(e: _Endpoint) -> tuple[str, str | None]:
        return e.model, e.urls[0] if e.urls else None

    critic_side = None if critic is None else side(critic)
    return open_clients(settings, api_key, side(generator), critic_side)


def _manifest(
    job: Job,
    input_path: Path,
    settings: Settings,
    generator: _Endpoint,
    critic: _Endpoint | None,
    input_fingerprint: dict[str, Any],
) -> Manifest:
    return Manifest(
        job=JobInfo(job.name, job.content_hash, job.source),
        input=InputInfo(str(input_path.resolve()), input_fingerprint),
        model=generator.model_id,
        feedback_model=None if critic is None else critic.model_id,
        base_url=clean_url(generator.urls[0]) if generator.urls else None,
        # the structured level actually tried first (the local server's, with --local)
        settings=replace(settings, structured=generator.structured),
        local_model=generator.provenance,
        feedback_local_model=None if critic is None else critic.provenance,
    )


def _check_budget(prices: PriceBook, generator: _Endpoint, critic: _Endpoint | None) -> None:
    for side in (generator, critic):
        if side is not None and not prices.known(side.model_id):
            raise ConfigError(
                f"--budget needs the price of {side.model_id!r}, which is not in the "
                "built-in table: give it with --prices FILE (JSON or TOML: model -> "
                "{input, output} dollars per million tokens)"
            )


async def arun(
    job: Job | str,
    input_path: str | Path,
    out_dir: str | Path,
    settings: Settings | None = None,
    *,
    api_key: str | None = None,
    client: ModelClient | None = None,
    critic: ModelClient | None = None,
    show_progress: bool = True,
    install_signal_handlers: bool = False,
    batch: BatchClients | None = None,
) -> RunSummary:
    """Run (or continue) ``job`` over ``input_path`` into ``out_dir``; async form of ``run``.

    ``client`` (and ``critic``) replace the OpenAI clients, and ``batch`` the Batch API
    clients of ``--batch``, for tests and embedding.
    """
    job = load_job(job) if isinstance(job, str) else job
    input_path = Path(input_path)
    check_input(input_path)  # a ConfigError naming the file and the formats accepted
    settings = resolve(settings or Settings(), job.max_iters)
    job = effective_job(job, settings)
    driver = _driver(settings)
    if api_key is None:
        api_key = os.environ.get("OPENAI_API_KEY")
    prices = price_book(settings.prices)
    rd = RunDir(Path(out_dir))
    with rd.lock():
        async with _endpoints(settings, rd.path) as (generator, critic_side):
            needs_key = client is None and not settings.local and not generator.urls
            if needs_key and not api_key:
                raise ConfigError(
                    "OPENAI_API_KEY is not set (or give --base-url for a server "
                    "that needs no key, or --local)"
                )
            if settings.budget is not None:
                _check_budget(prices, generator, critic_side)
            if settings.workers is not None and (client is not None or critic is not None):
                raise ConfigError("--workers opens its clients on the Ray workers: give no client")
            old = rd.read_manifest()
            # A Parquet input's fingerprint hashes the whole file: only a new run takes it
            # (a continued run keeps its own, checked by same_input below).
            known = old.input.fingerprint if old is not None else fingerprint(input_path)
            manifest = _manifest(job, input_path, settings, generator, critic_side, known)
            if old is not None:
                refuse_different(old, manifest, str(rd.path))
                if not same_input(input_path, old.input.fingerprint):
                    raise ConfigError(
                        f"{input_path} is not the input of the run in {rd.path} "
                        f"(that was {old.input.path}; only appending records is allowed)"
                    )
                manifest = old.continued_by(replace(manifest, input=old.input))
            rd.write_manifest(manifest)
            session = Session(job, input_path, rd, manifest, prices, show_progress)
            owned: list[OpenAIClient] = []
            gen_client = client
            if gen_client is None:
                gen_client = _open_client(generator, settings, api_key, session.budget)
                owned.append(gen_client)
            critic_client = critic
            if critic_client is None and critic_side is not None:
                if critic_side is generator and isinstance(gen_client, OpenAIClient):
                    critic_client = gen_client
                else:
                    critic_client = _open_client(critic_side, settings, api_key, session.budget)
                    owned.append(critic_client)
            models = Models(gen_client, critic_client, tuple(owned))
            if settings.batch:
                models.batch = batch or _batch_clients(settings, api_key, generator, critic_side)
            if settings.workers is not None:
                models.plan = ClientPlan(generator, critic_side, api_key)
            try:
                summary = await _execute(session, models, driver, install_signal_handlers)
            finally:
                await models.aclose()
            with contextlib.suppress(StoreError):
                rd.write_manifest(manifest.finished(summary.state, summary.exit_code))
            return summary


def run(
    job: Job | str,
    input_path: str | Path,
    out_dir: str | Path,
    settings: Settings | None = None,
    **kwargs: Any,
) -> RunSummary:
    """Run (or continue) ``job`` over ``input_path`` into ``out_dir``; see ``arun``."""
    return anyio.run(lambda: arun(job, input_path, out_dir, settings, **kwargs))


def resume_args(run_dir: str | Path) -> tuple[str, Path, Settings]:
    """The job, input and settings to continue the run in ``run_dir`` with.

    A run started on the default local model goes on with the model it started with,
    should the default have changed since (the manifest records it as ``local:NAME``).
    """
    manifest = RunDir(Path(run_dir)).require_manifest()
    settings = manifest.settings
    if settings.local and settings.local_model is None and manifest.model.startswith("local:"):
        settings = replace(settings, local_model=manifest.model.removeprefix("local:"))
    started = manifest.feedback_model or ""
    if (
        settings.critic_is_local
        and settings.critic_local_model is None
        and started.startswith("local:")
    ):
        settings = replace(settings, feedback_model=started)
    return manifest.job.source, Path(manifest.input.path), settings


async def aresume(run_dir: str | Path, **kwargs: Any) -> RunSummary:
    """Continue the run in ``run_dir`` with the settings its manifest records (async)."""
    job, input_path, settings = resume_args(run_dir)
    return await arun(job, input_path, run_dir, settings, **kwargs)


def resume(run_dir: str | Path, **kwargs: Any) -> RunSummary:
    """Continue the run in ``run_dir`` with the settings its manifest records."""
    return anyio.run(lambda: aresume(run_dir, **kwargs))
