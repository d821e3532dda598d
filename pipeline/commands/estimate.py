"""``refine estimate``: the calls, tokens and dollars of a run before it spends anything.

From the prompts alone: the loop's own prompt builder is run over the first records with
answers and feedback of an assumed length, for three scenarios —

    low        the critic accepts the first answer; answers a quarter of max_tokens
    expected   half the iteration budget is used; answers half of max_tokens
    high       every loop runs its whole budget (every refinement drafted as often as the
               job redrafts, and a copy retried at every step where it retries copies),
               every answer max_tokens long: pessimistic, though
               a call cut off at max_tokens and asked once more is counted once

— and scaled to the number of input lines. With ``--sample N`` the first N records run
for real (into a run directory, so they are not paid for twice) and the totals are
extrapolated from what they used: the mean per record, with a 90% interval.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path

import anyio
import orjson

from ..client.formats import LEVELS, FormatLadder
from ..client.models import ModelId
from ..client.prices import Price, PriceBook, at_batch_rate, price_book
from ..core.jobs import Job
from ..core.loader import load_job
from ..core.prompts import build_messages
from ..core.records import Record
from ..core.steps import CallKind, Role, Step
from ..core.trace import steps_of
from ..errors import ConfigError
from ..io.records import count_records, read_records
from ..runs.settings import Settings, cache_ttl_of, effective_job
from ..serving.registry import DEFAULT_MODEL as DEFAULT_LOCAL
from .caches import cache_usage
from .fit import Unfit, find_unfit

__all__ = [
    "SCENARIOS",
    "Estimate",
    "Figures",
    "Scenario",
    "from_prompts",
    "from_sample",
    "input_records",
    "render",
    "run_estimate",
    "sample_run",
]

PROMPT_RECORDS = 1000  # records whose prompts are built; the rest are scaled from them
_CACHE_WINDOW = 32  # prompts kept to find a shared prefix in (a record's, the ones before)
Z90 = 1.645  # two-sided 90% normal interval


@dataclass(frozen=True, slots=True)
class Scenario:
    """An assumption about how loops go: refinements made and answer length."""

    name: str
    refinements: float  # share of the iteration budget used (0 = the first answer is accepted)
    answer_share: float  # completion tokens as a share of max_tokens
    restarts: bool = False  # strategy restart drafts every refinement, where it is on
    copies: bool = False  # strategy copy-retry retries every refinement, where it is on


SCENARIOS = (
    Scenario("low", 0.0, 0.25),
    Scenario("expected", 0.5, 0.5, restarts=True),
    Scenario("high", 1.0, 1.0, restarts=True, copies=True),
)


@dataclass(frozen=True, slots=True)
class Figures:
    """Totals of one scenario for the whole input."""

    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None  # None: a model of the run has no price
    cached_tokens: int = 0  # prompt tokens the layout lets a provider serve from its cache
    uncached_cost_usd: float | None = None  # the cost were nothing served from cache
    cache_write_tokens: int = 0  # prompt tokens written to a cache that bills writes


@dataclass(frozen=True, slots=True)
class Estimate:
    """What a run would use: low, expected and high, and what the figures rest on."""

    records: int
    scenarios: Mapping[str, Figures]
    basis: str
    unfit: Unfit | None = None  # records whose prompt cannot fit the model's context


@dataclass(slots=True)
class _Sum:
    calls: int = 0
    prompt: int = 0
    cached: int = 0
    written: int = 0
    completion: int = 0
    cost: float | None = 0.0
    uncached: float | None = 0.0

    def add(self, usage: Mapping[str, int], price: Price | None, batch: bool) -> None:
        self.calls += 1
        self.prompt += usage["prompt_tokens"]
        self.cached += usage["cached_tokens"]
        self.written += usage.get("cache_write_tokens", 0)
        self.completion += usage["completion_tokens"]
        if price is None or self.cost is None or self.uncached is None:
            self.cost = self.uncached = None
            return
        self.cost += price.cost(usage, batch=batch)
        plain = {**usage, "cached_tokens": 0, "cache_write_tokens": 0, "cache_write_1h_tokens": 0}
        self.uncached += price.cost(plain, batch=batch)

    def scaled(self, factor: float) -> Figures:
        return Figures(
            round(self.calls * factor),
            round(self.prompt * factor),
            round(self.completion * factor),
            None if self.cost is None else round(self.cost * factor, 4),
            round(self.cached * factor),
            None if self.uncached is None else round(self.uncached * factor, 4),
            round(self.written * factor),
        )


def _filler(tokens: int) -> str:
    # estimate_tokens counts four ASCII characters a token.
    return "word " * max(1, math.ceil(tokens * 4 / 5))


def _calls(job: Job, max_iters: int, scenario: Scenario) -> list[tuple[Role, CallKind, int]]:
    """The (role, call kind, iteration) sequence of one loop under ``scenario``."""
    k = math.ceil(max_iters * scenario.refinements)
    s = job.strategies
    samples = [CallKind.SAMPLE] * (s.samples - 1)
    calls: list[tuple[Role, CallKind, int]] = [
        ("generate", call_kind, 0) for call_kind in [CallKind.ANSWER, *samples]
    ]
    for t in range(k):
        calls.append(("feedback", CallKind.FEEDBACK, t))
        calls += [("refine", call_kind, t + 1) for call_kind in [CallKind.ANSWER, *samples]]
        if s.restart and scenario.restarts:
            calls.append(("refine", CallKind.RESTART, t + 1))
        if s.copy_retry and scenario.copies:
            calls.append(("refine", CallKind.COPY_RETRY, t + 1))
    if max_iters > 0 and (k < max_iters or job.scored):
        calls.append(("feedback", CallKind.FEEDBACK, k))  # the feedback that stops the loop
    return calls


def _one_loop(
    job: Job,
    record: Record,
    max_iters: int,
    scenario: Scenario,
    ladder: FormatLadder,
    prices: PriceBook,
    model_for: Mapping[str, str],
    into: _Sum,
    batch: bool,
    seen: list[str],
    ttl: str | None = None,
) -> None:
    """Add one record's calls to ``into``; ``seen``: prompts sent before (the cache);
    ``ttl``: the TTL of the cache writes of a provider that bills them."""
    answer = round(job.max_tokens * scenario.answer_share)
    text = _filler(answer)
    steps: list[Step] = []
    last: dict[int, Step] = {}  # each iteration's answer
    for role, call_kind, t in _calls(job, max_iters, scenario):
        refined = last.get(t if role == "feedback" else t - 1)
        messages = build_messages(job, record, role, call_kind, t, steps, refined)
        schema = job.feedback_schema if role == "feedback" else None
        sent, _ = ladder.request(messages, schema, ladder.level)
        formatted = schema is not None and LEVELS[ladder.level] != "text"
        usage = cache_usage(sent, model_for[role], formatted, seen, ttl)
        usage["completion_tokens"] = answer
        into.add(usage, prices.price(model_for[role]), batch)
        output = None if role == "feedback" else text
        step = Step(role, t, sent, text, None, usage, 0.0, 1, output=output, call_kind=call_kind)
        steps.append(step)
        if role != "feedback" and call_kind in (CallKind.ANSWER, CallKind.COPY_RETRY):
            last[t] = step


def _records(job: Job, path: Path, settings: Settings) -> Iterator[Record]:
    items = read_records(path, job.inputs, settings.id_field)
    if settings.limit is not None:
        items = islice(items, settings.limit)  # --limit counts input lines, bad ones too
    for item in items:
        if isinstance(item, Record):
            yield item


def from_prompts(
    job: Job,
    input_path: Path,
    settings: Settings,
    prices: PriceBook,
    model_for: Mapping[str, str],
    *,
    prompt_records: int = PROMPT_RECORDS,
) -> Estimate:
    """Low / expected / high for the whole input, from the prompts of its first records."""
    max_iters = job.max_iters if settings.max_iters is None else settings.max_iters
    lines = input_records(input_path, settings)
    sampled = list(islice(_records(job, input_path, settings), prompt_records))
    if not sampled:
        raise ConfigError(f"{input_path}: no readable record to estimate from")
    # a local critic's server enforces the schema by a grammar: it is spelled out in the prompt
    local = ModelId.parse(model_for["feedback"]).is_local
    ladder = FormatLadder(settings.structured, grammar=local)
    # The Batch API and the flex tier bill the batch rate.
    batch = settings.batch or at_batch_rate(None, settings.service_tier)
    figures: dict[str, Figures] = {}
    for scenario in SCENARIOS:
        total = _Sum()
        seen: list[str] = []  # a provider's cache: the last few records' prompts
        for record in sampled:
            del seen[:-_CACHE_WINDOW]
            _one_loop(
                job,
                record,
                max_iters,
                scenario,
                ladder,
                prices,
                model_for,
                total,
                batch,
                seen,
                cache_ttl_of(settings),
            )
        factor = lines / len(sampled) if len(sampled) < lines else 1.0
        figures[scenario.name] = total.scaled(factor)
    basis = (
        f"prompts of the first {len(sampled)} records, scaled to {lines} input lines; "
        f"up to {max_iters} refinements, max_tokens {job.max_tokens}"
    )
    if settings.service_tier is not None:
        rate = "the batch rate" if batch else "the standard rate"
        basis += f"; service tier {settings.service_tier}, priced at {rate}"
    return Estimate(lines, figures, basis)


Sampled = tuple[int, int, int, float | None, int, float | None]
"""One sampled record: calls, prompt, completion and cached tokens, dollars, and dollars
were nothing served from the cache (None: a price is unknown)."""


def from_sample(per_record: Sequence[Sampled], total_records: int) -> Estimate:
    """Extrapolate the figures of sampled records to the whole input.

    Expected is the sample mean times the records; low and high bound a 90% interval of
    that total (the mean's standard error, times the records).
    """
    n = len(per_record)
    if n == 0:
        raise ConfigError("the sample finished no record to extrapolate from")
    columns = list(zip(*per_record, strict=True))
    figures: dict[str, list[float | None]] = {"low": [], "expected": [], "high": []}
    for column in columns:
        values = [v for v in column if v is not None]
        if len(values) < n:
            for name in figures:
                figures[name].append(None)
            continue
        mean = statistics.fmean(values)
        spread = statistics.stdev(values) / math.sqrt(n) if n > 1 else 0.0
        figures["low"].append(max(0.0, (mean - Z90 * spread)) * total_records)
        figures["expected"].append(mean * total_records)
        figures["high"].append((mean + Z90 * spread) * total_records)
    out = {
        name: Figures(
            round(v[0] or 0),
            round(v[1] or 0),
            round(v[2] or 0),
            None if v[3] is None else round(v[3], 4),
            # the cache's share of each scenario's prompt tokens is the sample's
            round((v[1] or 0) * _share(columns[4], columns[1])),
            None if v[5] is None else round(v[5], 4),
        )
        for name, v in figures.items()
    }
    basis = f"{n} records run for real, extrapolated to {total_records} (90% interval)"
    return Estimate(total_records, out, basis)


def _share(part: Sequence[float | None], whole: Sequence[float | None]) -> float:
    total = sum(w or 0 for w in whole)
    return sum(p or 0 for p in part) / total if total else 0.0


def render(est: Estimate) -> str:
    """The estimate as a small table."""
    rows = [f"estimate for {est.records} records ({est.basis})"]
    rows.append(
        f"{'':<10}{'calls':>12}{'prompt tok':>14}{'cached':>8}{'compl. tok':>14}"
        f"{'dollars':>12}{'no cache':>12}"
    )
    for name, f in est.scenarios.items():
        dollars = "unknown" if f.cost_usd is None else f"${f.cost_usd:,.2f}"
        uncached = "unknown" if f.uncached_cost_usd is None else f"${f.uncached_cost_usd:,.2f}"
        share = f"{f.cached_tokens / f.prompt_tokens:.0%}" if f.prompt_tokens else "-"
        rows.append(
            f"{name:<10}{f.calls:>12,}{f.prompt_tokens:>14,}{share:>8}{f.completion_tokens:>14,}"
            f"{dollars:>12}{uncached:>12}"
        )
    rows.append(
        "cached: the share of prompt tokens the provider's cache serves at the cached price "
        "(OpenAI: prompts of 1,024 tokens and more; Anthropic: the prefixes earlier calls "
        "marked); no cache: the cost without it"
    )
    written = {n: f.cache_write_tokens for n, f in est.scenarios.items() if f.cache_write_tokens}
    if written:
        counts = ", ".join(f"{n} {w:,}" for n, w in written.items())
        rows.append(
            f"cache writes (tokens, priced at the cache-write rate): {counts}; Anthropic's "
            "rule: a call reads the prefix an earlier call marked and writes the rest"
        )
    if any(f.cost_usd is None for f in est.scenarios.values()):
        rows.append("a model of this run has no price: give it with --prices FILE")
    if est.unfit is not None:
        rows.append(est.unfit.describe(est.records))
    return "\n".join(rows)


def input_records(input_path: Path, settings: Settings) -> int:
    """Input records the run would cover (its shard's share, estimated)."""
    lines = count_records(input_path)
    if settings.limit is not None:
        lines = min(lines, settings.limit)
    if settings.shard is not None:
        lines = math.ceil(lines / settings.shard[1])
    return lines


async def sample_run(
    job: Job,
    input_path: Path,
    settings: Settings,
    n: int,
    out: Path,
    **run_kwargs: object,
) -> Estimate:
    """Run the first ``n`` lines for real into ``out`` and extrapolate to the whole input."""
    from ..runner import arun  # the estimate module is imported by the CLI before a run

    total = input_records(input_path, settings)
    limit = n if settings.limit is None else min(n, settings.limit)
    summary = await arun(job, input_path, out, replace(settings, limit=limit), **run_kwargs)  # type: ignore[arg-type]
    if summary.exit_code not in (0, 1):
        raise ConfigError(f"the sample run stopped: {summary.message}")
    uncached = _uncached_costs(out / "traces.jsonl", prices_of(settings), _model_ids(settings))
    per_record: list[Sampled] = []
    with (out / "outputs.jsonl").open("rb") as fh:
        for raw in fh:
            line = orjson.loads(raw)
            usage = line["usage"]
            per_record.append(
                (
                    usage["calls"],
                    usage["prompt_tokens"],
                    usage["completion_tokens"],
                    line.get("cost_usd"),
                    usage.get("cached_tokens", 0),
                    uncached.get(str(line["id"])),
                )
            )
    return from_sample(per_record, total)


def prices_of(settings: Settings) -> PriceBook:
    """The run's prices: the built-in table under its --prices file."""
    return price_book(settings.prices)


def _uncached_costs(
    traces: Path, prices: PriceBook, model_for: Mapping[str, str]
) -> dict[str, float | None]:
    """Each traced record's dollars were none of its prompt tokens served from a cache."""
    costs: dict[str, float | None] = {}
    with traces.open("rb") as fh:
        for raw in fh:
            line = orjson.loads(raw)
            steps = steps_of(line["steps"])
            plain = [replace(s, usage={**s.usage, "cached_tokens": 0}) for s in steps]
            costs[str(line["id"])] = prices.steps_cost(
                [s for s in plain if not s.failed], model_for
            )
    return costs


def _model_ids(settings: Settings) -> dict[str, str]:
    """The model recorded for each role (as the run would name them)."""
    generator = settings.model
    if settings.local:
        generator = str(ModelId.local(settings.local_model or DEFAULT_LOCAL))
    critic = settings.feedback_model or generator
    if settings.critic_is_local:
        critic = str(ModelId.local(settings.critic_local_model or DEFAULT_LOCAL))
    return {"generate": generator, "refine": generator, "feedback": critic}


def run_estimate(
    job: Job | str,
    input_path: str | Path,
    settings: Settings,
    *,
    sample: int | None = None,
    out: Path | None = None,
) -> list[Estimate]:
    """The estimate from the prompts, and from a sample run when ``sample`` is given."""
    job = effective_job(load_job(job) if isinstance(job, str) else job, settings)
    input_path = Path(input_path)
    if not input_path.is_file():
        raise ConfigError(f"input file not found: {input_path}")
    prices = price_book(settings.prices)
    model_for = _model_ids(settings)
    first = from_prompts(job, input_path, settings, prices, model_for)
    estimates = [replace(first, unfit=find_unfit(job, input_path, settings, model_for))]
    if sample is not None:
        with contextlib.ExitStack() as stack:
            where = out or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="refine-")))
            estimates.append(
                anyio.run(
                    lambda: sample_run(
                        job, input_path, settings, sample, where, show_progress=False
                    )
                )
            )
    return estimates
