"""The ``refine`` argument parser: one builder per subcommand, and the settings it asks for."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..runs.settings import Settings
from ..sandbox import SandboxMode
from .options import (
    AUTO,
    add_pace_options,
    add_run_options,
    add_sandbox_option,
    positive_float,
    positive_int,
)

__all__ = ["AUTO", "EPILOG", "build_parser", "settings_from_args"]

_DEFAULTS = Settings()

EPILOG = """exit status:
  0    every input line (of the first --limit lines) became a record and every record is done
  1    finished, but some records failed or some input lines were unreadable
  2    bad usage or configuration, found before money is spent (unknown job or model,
       RUN_DIR in use or of another run, an endpoint that cannot be reached before any
       call succeeded, a hook that fails on every answer, a sandbox layer missing for a
       job that runs programs, without --sandbox weak)
  3    authentication failure (the endpoint refused the API key)
  4    the run directory cannot be written (disk full, read-only); resumable
  5    the endpoint stayed unavailable (5xx, 429, timeouts) longer than --max-outage,
       the flex tier had no capacity that long, or the quota or billing limit is spent;
       records stay pending; resumable
  6    --budget reached; resumable with a larger --budget
  75   --batch --detach: batches are still in flight; run the same command again later
  130  interrupted (SIGINT/SIGTERM); resumable with the same command or `refine resume`
"""


def _add_run(sub: Any) -> None:
    """`refine run`."""
    p = sub.add_parser(
        "run",
        help="start a run, or continue the same run",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_options(p)
    p.add_argument("--out", required=True, type=Path, help="run directory")
    add_pace_options(p)
    p.add_argument(
        "--budget",
        type=positive_float,
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
        type=positive_float,
        default=_DEFAULTS.poll,
        metavar="SECONDS",
        help="--batch: seconds between looks at the batches in flight (default %(default)g)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="run on Ray with N worker actors, each with --concurrency records in flight "
        "(needs refine[ray])",
    )
    p.add_argument(
        "--ray-address", metavar="ADDR", help="join this Ray cluster (default $RAY_ADDRESS)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")


def _add_resume(sub: Any) -> None:
    """`refine resume`."""
    p = sub.add_parser(
        "resume",
        help="continue a run with the settings in its manifest",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", type=Path)
    add_sandbox_option(p)
    p.add_argument("--quiet", action="store_true", help="no progress display")


def _add_status(sub: Any) -> None:
    """`refine status`."""
    p = sub.add_parser("status", help="done/failed/pending, calls, tokens and cost of a run")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", action="store_true", help="print JSON")


def _add_show(sub: Any) -> None:
    """`refine show`."""
    p = sub.add_parser(
        "show", help="one record's calls in order, each with its messages as sent (or in flight)"
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("record_id", metavar="ID", help="the record's id")
    p.add_argument(
        "--json", action="store_true", help="one JSON object per call, its messages as sent"
    )


def _add_report(sub: Any) -> None:
    """`refine report`."""
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
        type=positive_int,
        metavar="N",
        help="embed the iterations of at most N records (default 2000)",
    )


def _add_estimate(sub: Any) -> None:
    """`refine estimate`."""
    p = sub.add_parser(
        "estimate",
        help="expected calls, tokens and dollars of a run; spends nothing (unless --sample)",
    )
    add_run_options(p)
    add_pace_options(p)
    p.add_argument(
        "--sample",
        type=positive_int,
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


def _add_cancel(sub: Any) -> None:
    """`refine cancel`."""
    p = sub.add_parser(
        "cancel",
        help=(
            "cancel the run's batches in flight (OpenAI's Batch API or Claude's Message "
            "Batches; its records stay resumable)"
        ),
    )
    p.add_argument("run_dir", type=Path)


def _add_merge(sub: Any) -> None:
    """`refine merge`."""
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


def _add_jobs(sub: Any) -> None:
    """`refine jobs`."""
    p = sub.add_parser(
        "jobs",
        help="list the built-in jobs and their input fields (labels marked), or check one "
        "job and show what it holds",
    )
    p.add_argument(
        "job",
        nargs="?",
        help="a built-in job name or a job file: loaded (so validated: an error names the "
        "file, key and, for TOML syntax, the line) and described",
    )


def _add_sandbox(sub: Any) -> None:
    """`refine sandbox`."""
    p = sub.add_parser(
        "sandbox",
        help="the isolation model-written programs get on this machine, and a self-test",
        description="Show each layer of the sandbox (limits, privileges, no_new_privs, "
        "Landlock, seccomp, the audit hook), available or not, and run a small program "
        "under the kernel's layers that tries to read the home directory and the parent's "
        "environment, connect, start a process, signal its parent and write a file. Exits "
        "0 when every layer is in force and every attempt was denied, 2 otherwise (a run "
        "of a job that runs programs would stop there too, unless given --sandbox weak).",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _add_export(sub: Any) -> None:
    """`refine export`."""
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


def _add_calibrate(sub: Any) -> None:
    """`refine calibrate`."""
    p = sub.add_parser(
        "calibrate",
        help="refine, sample, or stop? run a labelled sample as Self-Refine, best-of-n at "
        "the same calls and the first answer: accuracy with intervals, cost, paired tests, "
        "the arm to run (--plan auto), and the rounds that pay (--max-iters auto)",
    )
    add_run_options(p)
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="DIR",
        help="the calibration's run directory; it gets calibration.json (run the same "
        "command again to continue it)",
    )
    add_pace_options(p)
    p.add_argument(
        "--sample",
        type=positive_int,
        default=50,
        metavar="N",
        help="records taken evenly from the input (default %(default)s)",
    )
    p.add_argument(
        "--metric",
        metavar="NAME",
        help="the right-or-wrong metric to judge by (default: the first the job reads "
        "from a label, such as gsm's correct)",
    )
    p.add_argument(
        "--arms",
        default="refine,best-of-n,first",
        metavar="LIST",
        help="the arms to compare (default %(default)s): refine (Self-Refine with these "
        "options), best-of-n (--max-iters 0 --strategy samples=N at refine's calls per "
        "record; needs refine), first (the first answer)",
    )
    p.add_argument(
        "--budget",
        type=positive_float,
        metavar="USD",
        help="dollars every arm together may spend (across resumes); at the cap it exits 6",
    )
    p.add_argument("--retry-failed", action="store_true", help="as for `refine run`")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument(
        "--json",
        action="store_true",
        help="print calibration.json (the cost estimate goes to stderr)",
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
    _add_run(sub)
    _add_resume(sub)
    _add_status(sub)
    _add_show(sub)
    _add_report(sub)
    _add_estimate(sub)
    _add_calibrate(sub)
    _add_cancel(sub)
    _add_merge(sub)
    _add_jobs(sub)
    _add_export(sub)
    _add_sandbox(sub)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The Settings a `refine run` (or `refine estimate`) command line asks for."""
    max_iters = args.max_iters
    loop = {
        "strategy": tuple(args.strategy),
        "min_iters": args.min_iters,
        "checks": args.checks,
        "repair": args.repair,
        "select": args.select,
    }
    chosen: dict[str, Any] = {}
    if getattr(args, "plan", None) is not None:
        max_iters, loop, chosen = _planned(args, loop)
    elif max_iters == AUTO or args.calibration is not None:
        max_iters, chosen["calibration"] = _recommended(args)
    urls = args.base_url or []
    base_url: str | tuple[str, ...] | None = (
        None if not urls else urls[0] if len(urls) == 1 else tuple(urls)
    )
    return Settings(
        model=args.model,
        base_url=base_url,
        feedback_model=args.feedback_model,
        feedback_base_url=args.feedback_base_url,
        max_iters=max_iters,
        **loop,
        **chosen,
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
        service_tier=getattr(args, "service_tier", None),
        context_tokens=args.context_tokens,
        cache_ttl=getattr(args, "cache_ttl", None),
        structured=getattr(args, "structured", _DEFAULTS.structured),
        sandbox=SandboxMode(args.sandbox),
    )


def _recommended(args: argparse.Namespace) -> tuple[int, str]:
    """--max-iters auto: the recommendation in --calibration DIR, for this job and model, and
    the file it was read from."""
    from ..commands.calibration import CALIBRATION, recommended_iters

    if args.max_iters != AUTO:
        raise ConfigError("--calibration goes with --max-iters auto or --plan")
    if args.calibration is None:
        raise ConfigError(
            "--max-iters auto needs --calibration DIR: the directory `refine calibrate "
            "JOB SAMPLE --out DIR` wrote"
        )
    local = args.local or args.local_model is not None
    iters = recommended_iters(args.calibration, args.job, None if local else args.model)
    return iters, str(Path(args.calibration).resolve() / CALIBRATION)


def _planned(
    args: argparse.Namespace, loop: dict[str, Any]
) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """--plan ARM: the refinements, strategies and loop options of the arm calibrated, and
    what the manifest records of the choice."""
    from ..commands.calibration import CALIBRATION, recommended_plan

    if args.calibration is None:
        raise ConfigError(
            f"--plan {args.plan} needs --calibration DIR: the directory `refine calibrate "
            "JOB SAMPLE --out DIR` wrote"
        )
    if args.max_iters is not None or args.strategy:
        raise ConfigError(
            "--plan sets --max-iters and the strategies to the calibrated arm's: give neither"
        )
    local = args.local or args.local_model is not None
    plan = recommended_plan(args.calibration, args.job, None if local else args.model, args.plan)
    for name, value in plan.loop.items():
        given = loop[name]
        if name != "strategy" and given != getattr(_DEFAULTS, name) and given != value:
            raise ConfigError(
                f"--plan {args.plan}: the arm {plan.arm} was calibrated with {name}={value!r}, "
                f"not {given!r}: drop the option, or calibrate with it"
            )
    where = str(Path(args.calibration).resolve() / CALIBRATION)
    return plan.max_iters, plan.loop, {"plan": plan.arm, "calibration": where}
