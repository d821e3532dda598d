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

from .calls import Role, Step
from .errors import ConfigError
from .formats import FormatLadder
from .jobs import Job, load_job
from .limits import estimate_tokens
from .local.registry import DEFAULT_MODEL as DEFAULT_LOCAL
from .loop import build_messages
from .prices import PriceBook, price_book
from .records import Record, count_records, read_records
from .settings import LOCAL_PREFIX, Settings

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
Z90 = 1.645  # two-sided 90% normal interval


@dataclass(frozen=True, slots=True)
class Scenario:
    """An assumption about how loops go: refinements made and answer length."""

    name: str
    refinements: float  # share of the iteration budget used (0 = the first answer is accepted)
    answer_share: float  # completion tokens as a share of max_tokens
    copies: bool = False  # every refinement redrafted and retried as a copy, where the job does


SCENARIOS = (
    Scenario("low", 0.0, 0.25),
    Scenario("expected", 0.5, 0.5),
    Scenario("high", 1.0, 1.0, copies=True),
)


@dataclass(frozen=True, slots=True)
class Figures:
    """Totals of one scenario for the whole input."""

    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None  # None: a model of the run has no price


@dataclass(frozen=True, slots=True)
class Estimate:
    """What a run would use: low, expected and high, and what the figures rest on."""

    records: int
    scenarios: Mapping[str, Figures]
    basis: str


@dataclass(slots=True)
class _Sum:
    calls: int = 0
    prompt: int = 0
    completion: int = 0
    cost: float | None = 0.0

    def add(self, prompt: int, completion: int, price_cost: float | None) -> None:
        self.calls += 1
        self.prompt += prompt
        self.completion += completion
        self.cost = None if self.cost is None or price_cost is None else self.cost + price_cost

    def scaled(self, factor: float) -> Figures:
        return Figures(
            round(self.calls * factor),
            round(self.prompt * factor),
            round(self.completion * factor),
            None if self.cost is None else round(self.cost * factor, 4),
        )


def _filler(tokens: int) -> str:
    # estimate_tokens counts four ASCII characters a token.
    return "word " * max(1, math.ceil(tokens * 4 / 5))


def _calls(job: Job, max_iters: int, scenario: Scenario) -> list[tuple[Role, int]]:
    """The (role, iteration) sequence of one loop under ``scenario``."""
    k = math.ceil(max_iters * scenario.refinements)
    calls: list[tuple[Role, int]] = [("generate", 0)]
    for t in range(k):
        calls.append(("feedback", t))
        calls.append(("refine", t + 1))
        if scenario.copies:
            calls.extend([("refine", t + 1)] * job.redraft)
        if scenario.copies and job.retry_copy:
            calls.append(("refine", t + 1))
    if max_iters > 0 and (k < max_iters or job.scored):
        calls.append(("feedback", k))  # the feedback that stops the loop, or scores the last
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
) -> None:
    answer = round(job.max_tokens * scenario.answer_share)
    text = _filler(answer)
    steps: list[Step] = []
    usage = {"prompt_tokens": 0, "completion_tokens": answer}
    for role, t in _calls(job, max_iters, scenario):
        messages = build_messages(job, record, role, t, steps)
        schema = job.feedback_schema if role == "feedback" else None
        sent, _ = ladder.request(messages, schema, ladder.level)
        prompt = estimate_tokens(sent)
        price = prices.price(model_for[role])
        cost = (
            None
            if price is None
            else price.cost({"prompt_tokens": prompt, "completion_tokens": answer}, batch=batch)
        )
        into.add(prompt, answer, cost)
        output = None if role == "feedback" else text
        steps.append(Step(role, t, sent, text, None, usage, 0.0, 1, output=output))


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
    local = model_for["feedback"].startswith(LOCAL_PREFIX + ":")
    ladder = FormatLadder(settings.structured, grammar=local)
    figures: dict[str, Figures] = {}
    for scenario in SCENARIOS:
        total = _Sum()
        for record in sampled:
            _one_loop(
                job, record, max_iters, scenario, ladder, prices, model_for, total, settings.batch
            )
        factor = lines / len(sampled) if len(sampled) < lines else 1.0
        figures[scenario.name] = total.scaled(factor)
    basis = (
        f"prompts of the first {len(sampled)} records, scaled to {lines} input lines; "
        f"up to {max_iters} refinements, max_tokens {job.max_tokens}"
    )
    return Estimate(lines, figures, basis)


def from_sample(
    per_record: Sequence[tuple[int, int, int, float | None]], total_records: int
) -> Estimate:
    """Extrapolate (calls, prompt, completion, dollars) of sampled records to the whole input.

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
        )
        for name, v in figures.items()
    }
    basis = f"{n} records run for real, extrapolated to {total_records} (90% interval)"
    return Estimate(total_records, out, basis)


def render(est: Estimate) -> str:
    """The estimate as a small table."""
    rows = [f"estimate for {est.records} records ({est.basis})"]
    rows.append(f"{'':<10}{'calls':>12}{'prompt tok':>14}{'compl. tok':>14}{'dollars':>12}")
    for name, f in est.scenarios.items():
        dollars = "unknown" if f.cost_usd is None else f"${f.cost_usd:,.2f}"
        rows.append(
            f"{name:<10}{f.calls:>12,}{f.prompt_tokens:>14,}{f.completion_tokens:>14,}{dollars:>12}"
        )
    if any(f.cost_usd is None for f in est.scenarios.values()):
        rows.append("a model of this run has no price: give it with --prices FILE")
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
    from .runner import arun  # the estimate module is imported by the CLI before a run

    total = input_records(input_path, settings)
    limit = n if settings.limit is None else min(n, settings.limit)
    summary = await arun(job, input_path, out, replace(settings, limit=limit), **run_kwargs)  # type: ignore[arg-type]
    if summary.exit_code not in (0, 1):
        raise ConfigError(f"the sample run stopped: {summary.message}")
    per_record: list[tuple[int, int, int, float | None]] = []
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
                )
            )
    return from_sample(per_record, total)


def _model_ids(settings: Settings) -> dict[str, str]:
    """The model recorded for each role (as the run would name them)."""
    generator = settings.model
    if settings.local:
        generator = f"local:{settings.local_model or DEFAULT_LOCAL}"
    critic = settings.feedback_model or generator
    if settings.critic_is_local:
        critic = f"local:{settings.critic_local_model or DEFAULT_LOCAL}"
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
    job = load_job(job) if isinstance(job, str) else job
    input_path = Path(input_path)
    if not input_path.is_file():
        raise ConfigError(f"input file not found: {input_path}")
    prices = price_book(settings.prices)
    estimates = [from_prompts(job, input_path, settings, prices, _model_ids(settings))]
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
