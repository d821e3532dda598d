"""The ``refine`` command line: parses arguments and calls the library, nothing more."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from . import status as status_mod
from .errors import ConfigError, RefineError, StoreError
from .jobs import builtin_jobs, load_job
from .report import write_report
from .rundir import RunDir
from .runner import EXIT, RunSummary, Settings, arun, settings_from_manifest

__all__ = ["main"]

log = logging.getLogger("refine")
_DEFAULTS = Settings()

EPILOG = """exit status:
  0    every input line became a record and every record is done
  1    finished, but some records failed or some input lines were unreadable
  2    bad usage or configuration (unknown job or model, RUN_DIR in use or of another run)
  3    authentication failure (the endpoint refused the API key)
  4    the run directory cannot be written (disk full, read-only); resumable
  5    the endpoint stayed unavailable longer than --max-outage; resumable
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="refine",
        description="Self-Refine over JSONL datasets: generate, feedback, refine.",
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
    p.add_argument("job", help="built-in job name (see `refine jobs`) or path to a job file")
    p.add_argument("input", type=Path, help="input JSONL file")
    p.add_argument("--out", required=True, type=Path, help="run directory")
    p.add_argument("--model", default=_DEFAULTS.model, help="model name (default %(default)s)")
    p.add_argument(
        "--base-url",
        help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL "
        "or OpenAI); the API key comes from $OPENAI_API_KEY",
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
        "--concurrency",
        type=_positive_int,
        default=_DEFAULTS.concurrency,
        help="records in flight (default %(default)s)",
    )
    p.add_argument("--rpm", type=_positive_float, help="requests per minute limit")
    p.add_argument("--tpm", type=_positive_float, help="tokens per minute limit")
    p.add_argument(
        "--timeout", type=_positive_float, help="seconds per request (default 60; 900 with --local)"
    )
    p.add_argument(
        "--max-retries",
        type=_non_negative_int,
        default=_DEFAULTS.max_retries,
        help="retries per call on 429/5xx/timeouts (default %(default)s)",
    )
    p.add_argument(
        "--max-outage",
        type=_positive_float,
        default=_DEFAULTS.max_outage,
        help="seconds an endpoint may keep failing (5xx, timeouts, refused connections) "
        "before the run stops, resumable (default %(default)g)",
    )
    p.add_argument(
        "--id-field",
        default=_DEFAULTS.id_field,
        help="input field holding the record id (default %(default)s; "
        "records without it get a content hash)",
    )
    p.add_argument("--limit", type=_positive_int, help="process only the first N records")
    p.add_argument(
        "--local",
        action="store_true",
        help="use the embedded local model (llama.cpp; needs refine[local])",
    )
    p.add_argument(
        "--local-model",
        help="local model name, hf:OWNER/NAME/FILE.gguf or path to a .gguf (implies --local)",
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

    p = sub.add_parser("status", help="done/failed/pending, tokens and cost of a run")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("report", help="summary of a run with plots (needs refine[report])")
    p.add_argument("run_dir", type=Path)
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="directory for report.md and its plots (default RUN_DIR/report)",
    )

    sub.add_parser("jobs", help="list built-in jobs and their input fields")
    return parser


def _print_summary(summary: RunSummary) -> None:
    c = summary.counters
    print(f"{summary.state}: {c.line()}")
    print(f"outputs: {summary.run_dir / 'outputs.jsonl'}")
    print(f"traces:  {summary.run_dir / 'traces.jsonl'}")
    if c.bad_lines:
        print(f"errors:  {summary.run_dir / 'errors.jsonl'} ({c.bad_lines} unreadable lines)")
    if summary.message:
        print(summary.message, file=sys.stderr)


def _cmd_run(args: argparse.Namespace) -> int:
    settings = Settings(
        model=args.model,
        base_url=args.base_url,
        max_iters=args.max_iters,
        min_iters=args.min_iters,
        checks=args.checks,
        concurrency=args.concurrency,
        rpm=args.rpm,
        tpm=args.tpm,
        timeout=args.timeout,
        max_retries=args.max_retries,
        max_outage=args.max_outage,
        id_field=args.id_field,
        limit=args.limit,
        local=args.local or args.local_model is not None,
        local_model=args.local_model,
    )
    return _execute(args.job, args.input, args.out, settings, quiet=args.quiet)


def _execute(job: str, input_path: Path, out: Path, settings: Settings, *, quiet: bool) -> int:
    summary = anyio.run(
        lambda: arun(
            job, input_path, out, settings, show_progress=not quiet, install_signal_handlers=True
        )
    )
    _print_summary(summary)
    return summary.exit_code


def _cmd_resume(args: argparse.Namespace) -> int:
    manifest = RunDir(args.run_dir).read_manifest()
    if manifest is None:
        raise ConfigError(f"{args.run_dir} holds no run (no manifest.json)")
    settings = settings_from_manifest(manifest)
    return _execute(
        manifest["job"]["source"],
        Path(manifest["input"]["path"]),
        args.run_dir,
        settings,
        quiet=args.quiet,
    )


def _cmd_status(args: argparse.Namespace) -> int:
    info = status_mod.collect(args.run_dir)
    if args.json:
        import orjson

        print(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode())
    else:
        print(status_mod.render(info))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    print(write_report(args.run_dir, args.out))
    return 0


def _cmd_jobs(_: argparse.Namespace) -> int:
    for name, path in builtin_jobs().items():
        job = load_job(str(path))
        fields = ", ".join(
            f.name + ("" if f.required else "?") + f" ({f.type})" for f in job.inputs
        )
        print(f"{name:<20} {fields}")
        if job.description:
            print(f"{'':<20} {job.description}")
    return 0


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
    commands: dict[str, Any] = {
        "run": _cmd_run,
        "resume": _cmd_resume,
        "status": _cmd_status,
        "jobs": _cmd_jobs,
        "report": _cmd_report,
    }
    try:
        code: int = commands[args.command](args)
    except StoreError as err:
        print(f"refine: error: {err}", file=sys.stderr)
        return EXIT["store"]
    except RefineError as err:
        print(f"refine: error: {err}", file=sys.stderr)
        return EXIT["config"]
    except KeyboardInterrupt:
        print("refine: interrupted", file=sys.stderr)
        return EXIT["interrupted"]
    return code


if __name__ == "__main__":
    sys.exit(main())
