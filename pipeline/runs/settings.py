"""Settings: how a run proceeds, everything but the job and the input.

``Settings`` is what a user (or the CLI) asks for; ``resolve`` fills in the values in force
(the job's iteration budget, the timeout for a local model), which the manifest stores, so
a resumed run proceeds exactly as the first one did.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..client.flex import FLEX, FLEX_TIMEOUT_S, SERVICE_TIERS
from ..client.models import ModelId, Provider
from ..core.jobs import Job
from ..core.strategies import parse_specs
from ..errors import ConfigError
from ..sandbox import SandboxMode

__all__ = [
    "BATCH_CACHE_TTL",
    "CACHE_TTLS",
    "DEFAULT_CACHE_TTL",
    "DEFAULT_MODEL",
    "DEFAULT_TIMEOUT_S",
    "LOCAL_TIMEOUT_S",
    "Settings",
    "cache_ttl_of",
    "effective_job",
    "parse_shard",
    "providers",
    "resolve",
]

DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_TIMEOUT_S = 60.0
LOCAL_TIMEOUT_S = 900.0  # a local model on a few cores answers long prompts slowly
CACHE_TTLS = ("5m", "1h")  # Anthropic's prompt cache lifetimes (docs/costs.md)
DEFAULT_CACHE_TTL = "5m"
BATCH_CACHE_TTL = "1h"  # under --batch: rounds take longer than five minutes


@dataclass(frozen=True, slots=True)
class Settings:
    """How to run: everything but the job and the input."""

    model: str = DEFAULT_MODEL
    # One endpoint, or several replicas of the same model (requests go to the least loaded).
    base_url: str | tuple[str, ...] | None = None
    feedback_model: str | None = None  # the critic on another model (None: the same model)
    feedback_base_url: str | None = None  # the critic's endpoint (None: the generator's)
    max_iters: int | None = None  # None: the job's default
    min_iters: int = 0  # refinements before the critic's done (or a score) may stop a loop
    checks: bool = True  # run the job's check hook on every answer
    strategy: tuple[str, ...] = ()  # --strategy specs over the job's own (samples=3, restart)
    repair: bool | None = None  # ask a call cut off at max_tokens once more (None: the job's)
    select: str | None = None  # the rule choosing the output (None: the job's)
    concurrency: int = 64
    rpm: float | None = None
    tpm: float | None = None
    timeout: float | None = None  # None: 60 s, or 900 s for a local model or the flex tier
    max_retries: int = 5
    max_outage: float = 300.0  # seconds an endpoint may keep failing before the run stops
    id_field: str = "id"
    limit: int | None = None  # only the first N records of the input
    shard: tuple[int, int] | None = None  # (I, N): only records whose id hashes to shard I of N
    local: bool = False
    local_model: str | None = None
    structured: str = "json_schema"  # first structured-output level to try
    fsync: bool = True
    prices: str | None = None  # a price file (JSON or TOML) over the built-in table
    budget: float | None = None  # dollars the run may spend in all, across resumes
    retry_failed: bool = False  # retry records that ended failed, from their last call
    batch: bool = False  # every call through the Batch API
    detach: bool = False  # --batch: submit, exit 75 while batches are in flight
    poll: float = 60.0  # --batch: seconds between looks at batches in flight
    workers: int | None = None  # run on Ray with this many worker actors
    ray_address: str | None = None  # join this Ray cluster (else $RAY_ADDRESS, else a local one)
    service_tier: str | None = None  # sent as ``service_tier`` (None: not sent); flex: batch rate
    context_tokens: int | None = None  # the models' context window (None: known models' own)
    # how long a prefix marked for Anthropic's prompt cache stays cached: "5m" or "1h"
    # (None: 5m; resolve() fills it in, the manifest keeps it)
    cache_ttl: str | None = None
    # the isolation programs need (weak: run them without a missing kernel layer); one
    # invocation's choice, never inherited by `refine resume`
    sandbox: SandboxMode = SandboxMode.STRICT
    # What chose the loop's settings, when `refine calibrate` did: the arm run (--plan) and
    # the calibration.json read (by --plan or --max-iters auto). Recorded, never compared.
    plan: str | None = None
    calibration: str | None = None

    def base_urls(self) -> tuple[str, ...]:
        """The generator's endpoints: ``base_url``, one or several (none: OpenAI's).

        ``$OPENAI_BASE_URL`` is read once, when a run starts (``runs.urls``), and recorded.
        """
        if isinstance(self.base_url, tuple):
            return self.base_url
        return (self.base_url,) if self.base_url else ()

    @property
    def critic_id(self) -> ModelId | None:
        """The critic ``--feedback-model`` names, parsed (None: the generator's model)."""
        return None if self.feedback_model is None else ModelId.parse(self.feedback_model)

    @property
    def critic_is_local(self) -> bool:
        """Whether ``--feedback-model`` names the embedded local model."""
        critic = self.critic_id
        return critic is not None and critic.is_local

    @property
    def critic_local_model(self) -> str | None:
        """The local model named by ``--feedback-model local:NAME`` (None: the default one)."""
        critic = self.critic_id
        return critic.name or None if critic is not None and critic.is_local else None


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` as (I, N), with 0 <= I < N."""
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not sep or n < 1 or not 0 <= i < n:
        raise ConfigError(f"--shard must be I/N with 0 <= I < N (got {text!r})")
    return i, n


def resolve(settings: Settings, job_max_iters: int) -> Settings:
    """Check the settings and fill in the values in force; raises ConfigError naming the flag."""
    problems: list[str] = []
    if settings.concurrency < 1:
        problems.append("--concurrency must be >= 1")
    max_iters = job_max_iters if settings.max_iters is None else settings.max_iters
    if max_iters < 0:
        problems.append("--max-iters must be >= 0")
    elif not 0 <= settings.min_iters <= max_iters:
        problems.append(f"--min-iters must be between 0 and --max-iters ({max_iters})")
    if settings.budget is not None and settings.budget <= 0:
        problems.append("--budget must be > 0 dollars")
    if settings.detach and not settings.batch:
        problems.append("--detach needs --batch")
    if settings.workers is not None and settings.workers < 1:
        problems.append("--workers must be >= 1")
    if settings.workers is not None and settings.batch:
        problems.append("--workers and --batch do not go together (batches need no workers)")
    if settings.workers is not None and (settings.local or settings.critic_is_local):
        problems.append(
            "--workers does not go with the embedded local model (one llama.cpp server gains "
            "nothing from more client processes); serve the model with several servers and "
            "give --base-url for each"
        )
    if settings.shard is not None:
        i, n = settings.shard
        if not 0 <= i < n:
            problems.append("--shard must be I/N with 0 <= I < N")
    if settings.poll <= 0:
        problems.append("--poll must be > 0 seconds")
    if settings.context_tokens is not None and settings.context_tokens < 1:
        problems.append("--context-tokens must be >= 1")
    if settings.service_tier is not None and settings.service_tier not in SERVICE_TIERS:
        problems.append(f"--service-tier must be one of {', '.join(SERVICE_TIERS)}")
    problems += _provider_problems(settings)
    if problems:
        raise ConfigError("; ".join(problems))
    timeout = settings.timeout
    if timeout is None:
        slow = settings.local or settings.critic_is_local
        timeout = LOCAL_TIMEOUT_S if slow else DEFAULT_TIMEOUT_S
        if settings.service_tier == FLEX:  # flex answers slowly: OpenAI advises 15 minutes
            timeout = max(timeout, FLEX_TIMEOUT_S)
    return replace(settings, max_iters=max_iters, timeout=timeout, cache_ttl=cache_ttl_of(settings))


def cache_ttl_of(settings: Settings) -> str:
    """The TTL of the prefixes a Claude call marks: --cache-ttl, else an hour under --batch
    (a record's next call comes a round later, past 5 minutes: an hour's write at 2x pays
    once two later calls read it), else 5 minutes (docs/costs.md)."""
    return settings.cache_ttl or (BATCH_CACHE_TTL if settings.batch else DEFAULT_CACHE_TTL)


def providers(settings: Settings) -> set[Provider]:
    """The providers the run's non-local sides call (the embedded model is no provider's)."""
    ids = [ModelId.parse(settings.model) if not settings.local else None, settings.critic_id]
    return {m.provider for m in ids if m is not None and not m.is_local}


def _provider_problems(settings: Settings) -> list[str]:
    """What the run's providers do not take."""
    problems = []
    called = providers(settings)
    if len(called) > 1:
        problems.append(
            "--model and --feedback-model name models of two providers (one API key a run): "
            "give both on one provider, or the critic as `local`"
        )
    if settings.cache_ttl is not None and settings.cache_ttl not in CACHE_TTLS:
        problems.append(f"--cache-ttl must be one of {', '.join(CACHE_TTLS)}")
    if Provider.ANTHROPIC in called and settings.service_tier is not None:
        problems.append("--service-tier is OpenAI's: Anthropic's models take none")
    return problems


def effective_job(job: Job, settings: Settings) -> Job:
    """``job`` with the strategies, repair and selection rule the settings ask for."""
    strategies = parse_specs(settings.strategy, job.strategies)
    if settings.repair is not None:
        strategies = replace(strategies, repair=settings.repair)
    select = settings.select or job.select
    if select != "default" and select not in job.answer_kind.selections:
        known = ", ".join(["default", *job.answer_kind.selections])
        raise ConfigError(f"--select {select}: job {job.name!r} offers {known}")
    return replace(job, strategies=strategies, select=select)


def settings_from_json(data: dict[str, Any]) -> Settings:
    """Settings from their manifest form; unknown keys (from newer versions) are ignored."""
    known = set(Settings.__dataclass_fields__)
    values = {k: v for k, v in data.items() if k in known}
    if isinstance(values.get("base_url"), list):
        values["base_url"] = tuple(values["base_url"])
    if isinstance(values.get("strategy"), list):
        values["strategy"] = tuple(values["strategy"])
    if "sandbox" in values:  # a mode this version does not know is the strictest
        weak = values["sandbox"] == SandboxMode.WEAK
        values["sandbox"] = SandboxMode.WEAK if weak else SandboxMode.STRICT
    if isinstance(values.get("shard"), list):
        i, n = values["shard"]
        values["shard"] = (int(i), int(n))
    return Settings(**values)
