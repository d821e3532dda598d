"""Running a job over an input into a run directory: ``pipeline.run``, ``arun`` and ``resume``.

The composition root. It resolves the job and the settings, looks up the backend the
settings name (``backends.chosen``: real time, the Batch API or Ray; it never asks which
it has), starts local servers where asked (``serving``), writes the manifest, makes the
``Session`` and asks the backend to open its driver over it and run it. Data flows one way:
the reader streams records to the driver, which runs each record's loop; every completed
call goes to the journal before the loop moves on; a finished record goes to outputs.jsonl
and traces.jsonl. Resume is the journal replaying its steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

from .backends import Backend, Driver, chosen, name_of
from .client.models import ModelId
from .client.prices import PriceBook, price_book
from .core.jobs import Job
from .core.loader import load_job
from .errors import ConfigError, RefineError, RunDirError, StoreError
from .io.inputs import check_input
from .io.records import fingerprint, fixed_in_place, kept_lines, same_input
from .runs.clients import ClientPlan, Endpoint
from .runs.manifest import (
    InputInfo,
    JobInfo,
    Manifest,
    clean_url,
    identity_change,
    refuse_different,
)
from .runs.outputs import rejected_lines
from .runs.restart import made_no_call, start_over
from .runs.rundir import RunDir
from .runs.session import EXIT, CallCounts, Halt, RunSummary, Session, halt_of
from .runs.settings import Settings, effective_job, resolve
from .runs.urls import carry_endpoints, endpoint_use, provider_of, record_endpoints
from .sandbox import Isolation, SandboxMode, require_isolation, use_mode

__all__ = ["EXIT", "RunSummary", "Settings", "aresume", "arun", "resume", "run"]

log = logging.getLogger("refine")


def _backend(settings: Settings, given: Backend | None) -> Backend:
    """The backend the settings name; one given must be the one they name."""
    name = name_of(settings)
    if given is not None and given.name != name:
        raise ConfigError(
            f"the backend given runs {given.name!r}, the settings ask for {name!r} "
            "(batch: --batch, ray: --workers, else realtime)"
        )
    backend = chosen(settings) if given is None else given
    backend.check(settings)
    return backend


async def _execute(
    session: Session, backend: Backend, plan: ClientPlan, install_signal_handlers: bool
) -> RunSummary:
    driver: Driver | None = None

    def counts() -> CallCounts:
        return CallCounts() if driver is None else driver.counts()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(session.journal.run)
            tg.start_soon(session.supervise, counts, tg.cancel_scope, install_signal_handlers)
            try:
                async with backend.open(session, plan) as driver:
                    await driver.preflight()
                    await driver.run()
            except* RefineError as group:  # once started, how a run ends is its summary's
                err = group.exceptions[0]
                session.halting.set(halt_of(err), err)
            tg.cancel_scope.cancel()
    except (KeyboardInterrupt, anyio.get_cancelled_exc_class()):
        session.halting.set(Halt.SIGNAL, KeyboardInterrupt("SIGINT"))
        raise
    finally:
        summary = session.close(counts())
    return summary


def _isolation(job: Job, settings: Settings) -> Isolation | None:
    """For a job that runs programs: the isolation they get here, said in the log (raises
    SandboxError in strict mode when a kernel layer is missing)."""
    if not job.runs_programs:
        return None
    isolation = require_isolation(settings.sandbox)
    if isolation.missing:
        log.warning("sandbox: %s", isolation.describe())
    else:
        log.info("sandbox: %s", isolation.describe())
    return isolation


def _resolve_endpoint(settings: Settings) -> Endpoint:
    model = ModelId.parse(settings.model)  # requests name the model without its prefix
    return Endpoint(model.name, model, settings.base_urls(), settings.structured, None)


@contextlib.asynccontextmanager
async def _endpoints(
    settings: Settings, run_dir: Path
) -> AsyncIterator[tuple[Endpoint, Endpoint | None]]:
    """Where the generator and the critic are served; starts local models as needed."""
    from .serving.endpoint import serve as serve_local  # the local extra, when asked for

    async with contextlib.AsyncExitStack() as stack:
        if settings.local:
            generator = await stack.enter_async_context(
                serve_local(settings.local_model, run_dir, settings.concurrency)
            )
        else:
            generator = _resolve_endpoint(settings)
        critic: Endpoint | None = None
        if settings.critic_is_local:
            name = settings.critic_local_model
            same = settings.local and (name is None or name == settings.local_model)
            critic = (
                generator
                if same
                else await stack.enter_async_context(
                    serve_local(name, run_dir, settings.concurrency)
                )
            )
        elif settings.feedback_model is not None:
            urls = (
                (settings.feedback_base_url,)
                if settings.feedback_base_url
                else (() if settings.local else generator.urls)
            )
            model = ModelId.parse(settings.feedback_model)
            critic = Endpoint(model.name, model, urls, settings.structured, None)
        if critic is not None and critic.model_id == generator.model_id:
            critic = None  # the critic is the generator
        yield generator, critic


def _manifest(
    job: Job,
    input_path: Path,
    settings: Settings,
    generator: Endpoint,
    critic: Endpoint | None,
    input_fingerprint: dict[str, Any],
) -> Manifest:
    return Manifest(
        job=JobInfo(job.name, job.content_hash, job.source),
        input=InputInfo(str(input_path.resolve()), input_fingerprint),
        model=str(generator.model_id),
        feedback_model=None if critic is None else str(critic.model_id),
        base_url=clean_url(generator.urls[0]) if generator.urls else None,
        # the structured level actually tried first (the local server's, with --local)
        settings=replace(settings, structured=generator.structured),
        local_model=generator.provenance,
        feedback_local_model=None if critic is None else critic.provenance,
    )


def _check_budget(prices: PriceBook, generator: Endpoint, critic: Endpoint | None) -> None:
    for side in (generator, critic):
        if side is not None and not prices.known(str(side.model_id)):
            raise ConfigError(
                f"--budget needs the price of {str(side.model_id)!r}, which is not in the "
                "built-in table: give it with --prices FILE (JSON or TOML: model -> "
                "{input, output[, cached_input, cache_write, cache_write_1h, batch]}, dollars "
                "per million tokens)"
            )


def _begin(
    rd: RunDir,
    old: Manifest | None,
    job: Job,
    input_path: Path,
    settings: Settings,
    sides: tuple[Endpoint, Endpoint | None],
    isolation: Isolation | None,
) -> Manifest:
    """The manifest of this invocation, written: a new run's, or the next of the same run.

    A different job, model, input or identity setting is refused, unless the run never
    had a model call succeed: then this command starts it over. An input whose only
    changes are at lines the run rejected (fixed in place) is the same input.
    """
    generator, critic = sides
    # A Parquet input's fingerprint hashes the whole file: only a new run takes it
    # (a continued run keeps its own, checked by _same_input).
    known = old.input.fingerprint if old is not None else fingerprint(input_path)
    manifest = _manifest(job, input_path, settings, generator, critic, known)
    if isolation is not None:
        manifest = replace(manifest, sandbox=isolation.as_json())
    if old is not None:
        change = identity_change(old, manifest)
        recorded = _same_input(rd, input_path, old)
        if (change is not None or recorded is None) and made_no_call(rd):
            what = "another input" if change is None else f"{change[0]}={change[2]!r}"
            log.warning(
                "%s held a run none of whose model calls succeeded: started over with %s",
                rd.path,
                what,
            )
            start_over(rd)
            fresh = InputInfo(manifest.input.path, fingerprint(input_path))
            manifest, old = replace(manifest, input=fresh), None
        else:
            refuse_different(old, manifest, str(rd.path))
            if recorded is None:
                raise RunDirError(
                    f"{input_path} is not the input of the run in {rd.path} (that was "
                    f"{old.input.path}): records may be appended, and the lines in "
                    "errors.jsonl fixed in place, nothing else changed. To start over with "
                    f"this input, give another --out (or delete {rd.path})"
                )
            continued = replace(manifest, input=replace(old.input, fingerprint=recorded))
            manifest = old.continued_by(continued)
    use = endpoint_use(
        generator.urls,
        settings.local,
        None if critic is None else settings.feedback_base_url,
        manifest.runs,
        provider_of(settings),
    )
    manifest, note = record_endpoints(manifest, old, use)
    if note:
        log.warning("%s", note)
    rd.write_manifest(manifest)
    return manifest


def _same_input(rd: RunDir, input_path: Path, old: Manifest) -> dict[str, Any] | None:
    """The fingerprint the continued run keeps, or None when ``input_path`` is not its
    input (records appended, or rejected lines fixed in place, are the same input)."""
    recorded = old.input.fingerprint
    if same_input(input_path, recorded):
        return recorded
    if fixed_in_place(input_path, recorded, rejected_lines(rd.errors_path)):
        log.info("%s: lines the run rejected were changed in place: read again", input_path)
        return fingerprint(input_path)
    return None


def _keep_rejected(manifest: Manifest, input_path: Path, rejected: set[int]) -> Manifest:
    """The manifest with what lets the input's rejected lines be fixed in place, taken from
    the input as it is now (if it is still the run's input)."""
    recorded = manifest.input.fingerprint
    if not rejected and "kept_sha256" not in recorded:
        return manifest
    try:
        if not same_input(input_path, recorded):
            return manifest
        kept = {k: v for k, v in recorded.items() if k not in ("kept_lines", "kept_sha256")}
        kept.update(kept_lines(input_path, rejected))
    except (OSError, ConfigError):
        return manifest  # the input is gone or changed: the next start says so
    return replace(manifest, input=replace(manifest.input, fingerprint=kept))


async def arun(
    job: Job | str,
    input_path: str | Path,
    out_dir: str | Path,
    settings: Settings | None = None,
    *,
    api_key: str | None = None,
    backend: Backend | None = None,
    show_progress: bool = True,
    install_signal_handlers: bool = False,
) -> RunSummary:
    """Run (or continue) ``job`` over ``input_path`` into ``out_dir``; async form of ``run``.

    What stops the run from starting (a ConfigError: the job, input, settings, run
    directory or local model; a StoreError: the directory cannot be written) is raised;
    once started, however the run ends is returned: the summary's exit status, message
    and error (docs/api.md). ``backend`` replaces the one the settings name by a backend
    of that name built otherwise, e.g. ``RealTimeBackend(client, critic)`` over clients of
    your own, for tests and embedding.
    """
    job = load_job(job) if isinstance(job, str) else job
    input_path = Path(input_path)
    check_input(input_path)  # a ConfigError naming the file and the formats accepted
    settings = resolve(settings or Settings(), job.max_iters)
    job = effective_job(job, settings)
    backend = _backend(settings, backend)
    # before a local server starts or a call is made (a child runs: off the event loop)
    isolation = await anyio.to_thread.run_sync(_isolation, job, settings)
    provider = provider_of(settings)
    key_env = provider.key_env or "OPENAI_API_KEY"  # (the embedded model's critic: OpenAI's)
    if api_key is None:
        api_key = os.environ.get(key_env)
    prices = price_book(settings.prices)
    rd = RunDir(Path(out_dir))
    with rd.lock():
        old = rd.read_manifest()
        settings, note = carry_endpoints(settings, old, os.environ)
        if note:
            log.warning("%s", note)
        async with _endpoints(settings, rd.path) as (generator, critic_side):
            needs_key = backend.opens_clients and not settings.local and not generator.urls
            if needs_key and not api_key:
                raise ConfigError(
                    f"{key_env} is not set (or give --base-url for a server "
                    "that needs no key, or --local)"
                )
            if needs_key:
                log.info(
                    "no --base-url or $%s: the calls go to %s",
                    provider.url_env,
                    provider.default_url,
                )
            if settings.budget is not None:
                _check_budget(prices, generator, critic_side)
            manifest = _begin(
                rd, old, job, input_path, settings, (generator, critic_side), isolation
            )
            session = Session(job, input_path, rd, manifest, prices, show_progress)
            plan = ClientPlan(generator, critic_side, api_key)
            with use_mode(settings.sandbox):
                summary = await _execute(session, backend, plan, install_signal_handlers)
            manifest = _keep_rejected(manifest, input_path, session.outputs.errors.keys)
            with contextlib.suppress(StoreError):
                rd.write_manifest(manifest.finished(summary.state, summary.exit_code))
            return summary


def run(
    job: Job | str,
    input_path: str | Path,
    out_dir: str | Path,
    settings: Settings | None = None,
    *,
    api_key: str | None = None,
    backend: Backend | None = None,
    show_progress: bool = True,
    install_signal_handlers: bool = False,
) -> RunSummary:
    """Run (or continue) ``job`` over ``input_path`` into ``out_dir``; see ``arun``."""
    return anyio.run(
        lambda: arun(
            job,
            input_path,
            out_dir,
            settings,
            api_key=api_key,
            backend=backend,
            show_progress=show_progress,
            install_signal_handlers=install_signal_handlers,
        )
    )


def resume_args(
    run_dir: str | Path, sandbox: SandboxMode = SandboxMode.STRICT
) -> tuple[str, Path, Settings]:
    """The job, input and settings to continue the run in ``run_dir`` with.

    A run started on the default local model goes on with the model it started with,
    should the default have changed since (the manifest records it as ``local:NAME``).
    Weaker isolation is never inherited: ``sandbox`` is this invocation's.
    """
    manifest = RunDir(Path(run_dir)).require_manifest()
    settings = replace(manifest.settings, sandbox=sandbox)
    generator = ModelId.parse(manifest.model)
    if settings.local and settings.local_model is None and generator.is_local:
        settings = replace(settings, local_model=generator.name)
    critic = ModelId.parse(manifest.feedback_model or "")
    if settings.critic_is_local and settings.critic_local_model is None and critic.is_local:
        settings = replace(settings, feedback_model=str(critic))
    return manifest.job.source, Path(manifest.input.path), settings


async def aresume(
    run_dir: str | Path,
    *,
    sandbox: SandboxMode = SandboxMode.STRICT,
    api_key: str | None = None,
    backend: Backend | None = None,
    show_progress: bool = True,
    install_signal_handlers: bool = False,
) -> RunSummary:
    """Continue the run in ``run_dir`` with the settings its manifest records (async);
    programs run in ``sandbox`` mode, whatever the earlier invocations had. The other
    keywords are ``arun``'s."""
    job, input_path, settings = resume_args(run_dir, sandbox)
    return await arun(
        job,
        input_path,
        run_dir,
        settings,
        api_key=api_key,
        backend=backend,
        show_progress=show_progress,
        install_signal_handlers=install_signal_handlers,
    )


def resume(
    run_dir: str | Path,
    *,
    sandbox: SandboxMode = SandboxMode.STRICT,
    api_key: str | None = None,
    backend: Backend | None = None,
    show_progress: bool = True,
    install_signal_handlers: bool = False,
) -> RunSummary:
    """Continue the run in ``run_dir`` with the settings its manifest records."""
    return anyio.run(
        lambda: aresume(
            run_dir,
            sandbox=sandbox,
            api_key=api_key,
            backend=backend,
            show_progress=show_progress,
            install_signal_handlers=install_signal_handlers,
        )
    )
