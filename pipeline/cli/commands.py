"""What each ``refine`` subcommand does: call the library, print what it says."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import ConfigError
from ..runs.exits import EXIT
from ..sandbox import SandboxMode
from .parser import AUTO, settings_from_args

if TYPE_CHECKING:
    from ..runner import RunSummary

# Each command imports what it needs when it runs: one that calls no model (status, show,
# report, export, jobs, --help) starts without the runner and the HTTP SDKs it brings.

__all__ = ["COMMANDS", "Console"]

log = logging.getLogger("refine")


class Console:
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
    Console.print(f"{summary.state}: {c.line()}")
    Console.print(f"outputs: {summary.run_dir / 'outputs.jsonl'}")
    Console.print(f"traces:  {summary.run_dir / 'traces.jsonl'}")
    if c.bad_lines:
        Console.print(
            f"errors:  {summary.run_dir / 'errors.jsonl'} ({c.bad_lines} unreadable lines)"
        )
    if summary.message:
        Console.print(summary.message, file=sys.stderr)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import anyio

    from ..commands.arms import parse_arms
    from ..commands.calibrate import acalibrate
    from ..commands.calibration import render

    if args.max_iters == AUTO or args.plan is not None:
        raise ConfigError(
            "refine calibrate measures the rounds and the arms: give --max-iters a number "
            "(and no --plan)"
        )
    arms = parse_arms(args.arms)
    settings = settings_from_args(args)
    done = anyio.run(
        lambda: acalibrate(
            args.job,
            args.input,
            args.out,
            settings,
            sample=args.sample,
            metric=args.metric,
            arms=arms,
            announce=lambda text: Console.print(text, file=sys.stderr if args.json else None),
            show_progress=not args.quiet,
            install_signal_handlers=True,
        )
    )
    if done.calibration is None:
        if done.summary is not None:
            _print_summary(done.summary)
        elif done.message:
            Console.print(done.message, file=sys.stderr)
    elif args.json:
        Console.print(orjson.dumps(done.calibration.data, option=orjson.OPT_INDENT_2).decode())
    else:
        Console.print(render(done.calibration.data, args.out))
    return done.exit_code


def _cmd_run(args: argparse.Namespace) -> int:
    import anyio

    from ..runner import arun

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
    import anyio

    from ..runner import aresume

    summary = anyio.run(
        lambda: aresume(
            args.run_dir,
            sandbox=SandboxMode(args.sandbox),
            show_progress=not args.quiet,
            install_signal_handlers=True,
        )
    )
    _print_summary(summary)
    return summary.exit_code


def _cmd_status(args: argparse.Namespace) -> int:
    from ..commands import status as status_mod

    info = status_mod.collect(args.run_dir)
    if args.json:
        Console.print(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode())
    else:
        Console.print(status_mod.render(info))
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from ..commands import show as show_mod

    trace = show_mod.show(args.run_dir, args.record_id)
    if args.json:
        Console.print(show_mod.json_lines(trace).decode().rstrip("\n"))
    else:
        Console.print(show_mod.render(trace))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from ..report import DETAIL_LIMIT, read_ids, write_report

    records = None if args.records is None else read_ids(args.records)
    details = DETAIL_LIMIT if args.details is None else args.details
    files = write_report(args.run_dir, args.out, records=records, details=details)
    Console.print(files.markdown)
    Console.print(files.html)
    return 0


def _cmd_estimate(args: argparse.Namespace) -> int:
    from ..commands import estimate as estimate_mod

    settings = settings_from_args(args)
    estimates = estimate_mod.run_estimate(
        args.job, args.input, settings, sample=args.sample, out=args.out
    )
    if args.json:
        Console.print(orjson.dumps(estimates, option=orjson.OPT_INDENT_2).decode())
    else:
        Console.print("\n\n".join(estimate_mod.render(e) for e in estimates))
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    import anyio

    from ..commands.cancel import acancel

    infos = anyio.run(lambda: acancel(args.run_dir))
    for info in infos:
        Console.print(f"{info.id}: {info.status}")
    Console.print(
        f"{len(infos)} batch(es) cancelled; `refine run` (the same command) or "
        "`refine resume` keeps their finished lines and sends the rest again"
    )
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from ..commands.export import export

    done = export(args.run_dir, args.output, with_input=args.with_input)
    Console.print(f"{done.rows} rows written to {done.path} ({done.format})")
    partial = done.partial()
    if partial is not None:
        Console.print(f"refine: {partial}", file=sys.stderr)
    if done.without_input:
        Console.print(
            f"{done.without_input} rows without input columns: their record was not found "
            "in the input",
            file=sys.stderr,
        )
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from ..commands import merge as merge_mod

    summary = merge_mod.merge(args.out_dir, args.run_dirs, partial=args.partial)
    Console.print(merge_mod.describe(summary))
    return summary.exit_code


def _cmd_jobs(args: argparse.Namespace) -> int:
    from ..commands import jobs as jobs_mod

    if args.job is None:
        Console.print(jobs_mod.listing())
    else:
        Console.print(jobs_mod.describe(args.job))
    return 0


def _cmd_sandbox(args: argparse.Namespace) -> int:
    from ..commands import sandbox as sandbox_mod

    found = sandbox_mod.check()
    if args.json:
        Console.print(orjson.dumps(found.as_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        Console.print(sandbox_mod.render(found))
    return 0 if found.ok else EXIT["config"]


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _cmd_run,
    "resume": _cmd_resume,
    "status": _cmd_status,
    "show": _cmd_show,
    "jobs": _cmd_jobs,
    "report": _cmd_report,
    "estimate": _cmd_estimate,
    "calibrate": _cmd_calibrate,
    "cancel": _cmd_cancel,
    "export": _cmd_export,
    "merge": _cmd_merge,
    "sandbox": _cmd_sandbox,
}
