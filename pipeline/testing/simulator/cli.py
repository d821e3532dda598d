"""The command line: ``python -m pipeline.testing.simulator --port 0 --latency 0.05 ...``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from .answerkey import AnswerKey
from .config import FAULTS, STRUCTURED_LEVELS, SimConfig
from .server import Simulator

__all__ = ["DESCRIPTION", "build_parser", "main", "notice"]


def _outage(text: str) -> tuple[float, float]:
    start, sep, end = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("an outage is START:END in seconds since server start")
    return float(start), float(end)


def _statuses(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError("statuses are comma-separated integers") from err


def _names(values: list[str] | None) -> tuple[str, ...] | None:
    if values is None:
        return None
    return tuple(m.strip() for arg in values for m in arg.split(",") if m.strip())


def _optional_int(text: str) -> int | None:
    return None if text.lower() in ("", "none", "off") else int(text)


DESCRIPTION = """\
An HTTP server speaking OpenAI's API (base URL: the printed URL) and Anthropic's Messages
API and Message Batches (base URL: the printed URL without /v1), for tests, benchmarks
and `scripts/demo --simulated`.
Its answers are synthetic: deterministic prose, code and JSON made from the request and
the seed (JSON valid against the request's schema), never a model's. It accepts any model
name unless --models names some, and any API key unless --api-key sets one. It prints
"listening URL" on stdout once ready and serves until SIGTERM or SIGINT."""

_FAULT_HELP = {
    "p_500": "probability that a request is answered 500 (server_error)",
    "p_503": "probability that a request is answered 503 (overloaded)",
    "p_hang": "probability that a request gets no answer for --hang seconds, then a reset",
    "p_reset": "probability that the connection is reset with no answer",
    "p_truncate": "probability that an answer's body is cut off mid-way",
    "p_length": "probability that an answer is cut at max_tokens (finish_reason length)",
    "p_refusal": "probability that the model refuses (a refusal instead of content)",
}


def notice(config: SimConfig) -> str:
    """What the simulator accepts and answers, said when it starts (on stderr)."""
    models = "any model name" if config.models is None else "the models " + ", ".join(config.models)
    key = "any API key" if config.api_key is None else "only the API key given by --api-key"
    return f"simulator: accepts {models} and {key}; its answers are synthetic, not a model's"


def build_parser() -> argparse.ArgumentParser:
    """The simulator's argument parser (defaults from ``SimConfig``)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.testing.simulator",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = SimConfig()
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=0, help="port to listen on (0: a free one, printed)"
    )
    parser.add_argument("--log", dest="log_path", default=None, help="append JSONL request log")
    answers = parser.add_argument_group("answers")
    answers.add_argument(
        "--latency",
        "--latency-s",
        dest="latency_s",
        type=float,
        default=d.latency_s,
        help=f"seconds before each answer (default: {d.latency_s})",
    )
    answers.add_argument(
        "--jitter",
        "--jitter-s",
        dest="jitter_s",
        type=float,
        default=d.jitter_s,
        help=f"up to this many seconds added to or taken from the latency (default: {d.jitter_s})",
    )
    answers.add_argument(
        "--p-done",
        dest="p_done",
        type=float,
        default=d.p_done,
        help=f"share of feedback answers whose done field is true (default: {d.p_done})",
    )
    answers.add_argument(
        "--seed", type=int, default=d.seed, help="seed of the answers and the jitter (default: 0)"
    )
    answers.add_argument(
        "--api-key",
        dest="api_key",
        default=d.api_key,
        help="answer 401 to requests without this bearer token (default: accept any key)",
    )
    answers.add_argument(
        "--models",
        "--model",
        dest="models",
        action="append",
        default=None,
        help="accepted model names, comma separated and/or repeated; others get 404 "
        "(default: accept any name)",
    )
    answers.add_argument(
        "--structured",
        choices=STRUCTURED_LEVELS,
        default=d.structured,
        help="the strongest response_format supported: json_schema, json_object only, or "
        "none (400 for any response_format); Anthropic's output_config is taken at "
        "json_schema only (default: json_schema)",
    )
    answers.add_argument(
        "--fence-json",
        dest="fence_json",
        action="store_true",
        help="wrap JSON answers in a ```json fence, as some models do",
    )
    limits = parser.add_argument_group("rate limits")
    limits.add_argument(
        "--rpm",
        type=float,
        default=d.rpm,
        help="requests per minute, each API its own bucket, else 429 (default: none)",
    )
    limits.add_argument(
        "--tpm",
        type=float,
        default=d.tpm,
        help="OpenAI's tokens per minute, else 429 (default: none)",
    )
    faults = parser.add_argument_group("faults")
    for name in FAULTS:
        flag = "--" + name.replace("_", "-")
        faults.add_argument(
            flag,
            dest=name,
            type=float,
            default=getattr(d, name),
            help=f"{_FAULT_HELP[name]} (default: {getattr(d, name)})",
        )
    faults.add_argument(
        "--hang",
        "--hang-s",
        dest="hang_s",
        type=float,
        default=d.hang_s,
        help=f"seconds a hanging request waits before its reset (default: {d.hang_s:g})",
    )
    faults.add_argument(
        "--outage",
        "--outages",
        dest="outages",
        type=_outage,
        action="append",
        default=[],
        help="START:END seconds since server start answering 503 (repeatable)",
    )
    faults.add_argument(
        "--faults-seed",
        dest="faults_seed",
        type=int,
        default=d.faults_seed,
        help="seed of the fault draws, apart from the answers' (default: 0)",
    )
    real = parser.add_argument_group("faults as real providers send them")
    real.add_argument(
        "--retry-after",
        dest="retry_after_s",
        type=float,
        default=d.retry_after_s,
        help="seconds every 5xx answer asks the client to wait (Retry-After)",
    )
    real.add_argument(
        "--retry-after-unit",
        dest="retry_after_unit",
        choices=("s", "ms"),
        default=d.retry_after_unit,
        help="send it as retry-after (s) or retry-after-ms (ms)",
    )
    real.add_argument(
        "--poison", default=d.poison, help="requests whose messages hold this text always fail"
    )
    real.add_argument(
        "--poison-status",
        dest="poison_status",
        type=int,
        default=d.poison_status,
        help=f"the status those requests get (default: {d.poison_status})",
    )
    real.add_argument(
        "--context-limit",
        dest="context_limit",
        type=_optional_int,
        default=d.context_limit,
        help="prompt plus max_tokens above this: 400 context_length_exceeded",
    )
    real.add_argument(
        "--throttle",
        dest="throttles",
        type=_outage,
        action="append",
        default=[],
        help="START:END seconds answering 429 without Retry-After (repeatable)",
    )
    real.add_argument(
        "--quota",
        dest="quota_requests",
        type=_optional_int,
        default=d.quota_requests,
        help="answers the key's quota covers; then 429 insufficient_quota",
    )
    _add_cache_and_tiers(parser, d)
    _add_answer_key(parser, d)
    _add_anthropic(parser, d)
    batch = parser.add_argument_group("Batch API (the timings and failures: Message Batches too)")
    for flag, name, convert, help_ in (
        ("--batch-validating", "batch_validating_s", float, "seconds a batch spends validating"),
        ("--batch-delay", "batch_delay_s", float, "seconds in progress (the completion delay)"),
        ("--batch-finalizing", "batch_finalizing_s", float, "seconds finalizing (or cancelling)"),
        ("--p-line-fail", "p_line_fail", float, "probability that a batch line fails"),
        ("--line-fail-statuses", "line_fail_statuses", _statuses, "statuses of failed lines"),
        ("--p-batch-expire", "p_batch_expire", float, "probability that a batch expires"),
        ("--expire-fraction", "expire_fraction", float, "share of an expiring batch finished"),
        ("--batch-max-requests", "batch_max_requests", int, "lines per batch at most"),
        ("--batch-max-bytes", "batch_max_bytes", int, "input file size at most"),
        ("--batch-token-limit", "batch_token_limit", _optional_int, "enqueued tokens per model"),
        ("--batch-max-in-progress", "batch_max_in_progress", _optional_int, "batches in flight"),
    ):
        default = getattr(d, name)
        batch.add_argument(
            flag, dest=name, type=convert, default=default, help=f"{help_} (default: {default})"
        )
    batch.add_argument(
        "--no-batch-shuffle",
        dest="batch_shuffle",
        action="store_false",
        help="write output lines in input order",
    )
    return parser


def _add_cache_and_tiers(parser: argparse.ArgumentParser, d: SimConfig) -> None:
    """The prefix cache, the flex tier and the prices of the server's bill."""
    group = parser.add_argument_group("prefix cache, service tiers and the bill")
    group.add_argument(
        "--no-prefix-cache",
        dest="prefix_cache",
        action="store_false",
        help="report no cached tokens (the cache is on by default: OpenAI's rule)",
    )
    group.add_argument(
        "--refuse-cache-key",
        dest="accept_cache_key",
        action="store_false",
        help="answer a request naming prompt_cache_key with 400 (unrecognized argument)",
    )
    for flag, name, help_ in (
        ("--cache-ttl", "cache_ttl_s", "seconds a cached prefix lives after its last use"),
        ("--flex-slowdown", "flex_slowdown", "flex answers take this many times the latency"),
        ("--p-flex-unavailable", "p_flex_unavailable", "share of flex requests refused (429)"),
        ("--price-input", "price_input", "the bill's dollars per million prompt tokens"),
        ("--price-cached-input", "price_cached_input", "... per million cached prompt tokens"),
        ("--price-output", "price_output", "... per million completion tokens"),
        ("--batch-discount", "batch_discount", "price factor of flex and Batch API lines"),
        ("--priority-factor", "priority_factor", "price factor of the priority tier"),
    ):
        default = getattr(d, name)
        group.add_argument(
            flag, dest=name, type=float, default=default, help=f"{help_} (default: {default})"
        )


def _add_answer_key(parser: argparse.ArgumentParser, d: SimConfig) -> None:
    """A model that knows the answers to some questions, right at a set rate."""
    group = parser.add_argument_group(
        "a model that knows some answers",
        "Requests about a question of --answer-key get a program-aided answer "
        "(def solution(): return N), right with the probabilities below, else wrong: "
        "make refinement help (--p-right-refined above --p-right) or hurt (below).",
    )
    group.add_argument(
        "--answer-key",
        metavar="FILE",
        help="JSONL of gsm-shaped records: 'input' the question, 'target' its number",
    )
    group.add_argument(
        "--p-right",
        dest="p_right",
        type=float,
        default=d.p_right,
        help=f"probability that a first draft is right (default: {d.p_right})",
    )
    group.add_argument(
        "--p-right-refined",
        dest="p_right_refined",
        type=float,
        default=d.p_right_refined,
        help="probability that a refinement is right (default: --p-right)",
    )


def _add_anthropic(parser: argparse.ArgumentParser, d: SimConfig) -> None:
    """Anthropic's Messages API: its limits, its own faults, its cache, Message Batches."""
    group = parser.add_argument_group(
        "Anthropic (Messages API, Message Batches)",
        "p-500, p-hang, p-reset, p-truncate, p-length, p-refusal, outages, throttles, poison, "
        "context-limit, quota and retry-after apply to it too, in Anthropic's words; "
        "p-503 does not (its overload is --p-529).",
    )
    for flag, name, convert, help_ in (
        ("--itpm", "itpm", float, "input tokens per minute (uncached and cache writes)"),
        ("--otpm", "otpm", float, "output tokens per minute (max_tokens, then settled)"),
        ("--p-429", "p_429", float, "share of messages refused 429 rate_limit_error"),
        ("--p-529", "p_529", float, "share of messages refused 529 overloaded_error"),
        (
            "--cache-min-tokens",
            "cache_min_tokens",
            _optional_int,
            "shortest cacheable prefix for every model (none: each model's documented one)",
        ),
        (
            "--message-batch-max-requests",
            "message_batch_max_requests",
            int,
            "requests per Message Batch at most",
        ),
        (
            "--message-batch-max-bytes",
            "message_batch_max_bytes",
            int,
            "Message Batch request body at most (beyond: 413)",
        ),
    ):
        default = getattr(d, name)
        group.add_argument(
            flag, dest=name, type=convert, default=default, help=f"{help_} (default: {default})"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulator as a process until SIGTERM/SIGINT."""
    values: dict[str, Any] = vars(build_parser().parse_args(argv))
    values["models"] = _names(values["models"])
    values["outages"] = tuple(values["outages"])
    values["throttles"] = tuple(values["throttles"])
    host: str = values.pop("host")
    port: int = values.pop("port")
    log_path: str | None = values.pop("log_path")
    known = {f.name for f in fields(SimConfig)}
    try:
        if values["answer_key"] is not None:
            values["answer_key"] = AnswerKey.read(values["answer_key"])
        config = SimConfig(**{k: v for k, v in values.items() if k in known})
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def announce(url: str) -> None:
        print(notice(config), file=sys.stderr, flush=True)
        sys.stdout.write(f"listening {url}\n")
        sys.stdout.flush()

    Simulator(config, host, port, log_path, keep_requests=False).serve_forever(announce)
    return 0
