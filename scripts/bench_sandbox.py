#!/usr/bin/env python3
"""Sandbox benchmark: the wall time of one sandboxed program, with and without the kernel layers.

Both configurations run in this process, interleaved round by round (the order flipping
each round), so a busy shared machine slows both alike; the figure is the ratio of their
medians:

- before: the limits and the audit hook only, what the sandbox was before the kernel
  layers (``SandboxPolicy(WEAK, {AUDIT_HOOK})``; the confinement code loads but applies nothing);
- after: every layer, strict: leaving root, no_new_privs, Landlock, seccomp, then the
  audit hook (``SandboxPolicy(STRICT)``, what a run uses).

Two programs: a hello program (``print``), and a code-improve test run (``run_tests``:
an answer's function and five asserts, each run on its own as the job's check does).
Target: after / before <= 1.25 for each.

Usage: scripts/bench_sandbox.py [--rounds 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.sandbox import Layer, SandboxMode, SandboxPolicy, run_python, run_tests  # noqa: E402

BEFORE = SandboxPolicy(SandboxMode.WEAK, frozenset({Layer.AUDIT_HOOK}))
AFTER = SandboxPolicy(SandboxMode.STRICT)
TARGET = 1.25

CODE = '''
def running_max(values):
    """The largest value so far, at each position."""
    best, out = None, []
    for v in values:
        best = v if best is None or v > best else best
        out.append(best)
    return out
'''
TESTS = (
    "assert running_max([]) == []",
    "assert running_max([3]) == [3]",
    "assert running_max([1, 3, 2]) == [1, 3, 3]",
    "assert running_max([5, 4, 6, 1]) == [5, 5, 6, 6]",
    "assert running_max([-1, -2]) == [-1, -1]",
)


def hello(policy: SandboxPolicy) -> None:
    result = run_python("print('hello')", policy=policy)
    assert result.ok and result.stdout == "hello\n", result


def tests(policy: SandboxPolicy) -> None:
    done = run_tests(CODE, TESTS, policy=policy)
    assert done.error is None and done.passed == len(TESTS), done


def measure(program: Callable[[SandboxPolicy], None], rounds: int) -> tuple[float, float]:
    """Median seconds per run (before, after), interleaved."""
    times: dict[str, list[float]] = {"before": [], "after": []}
    program(BEFORE)  # warm the page cache and the bytecode caches for both
    program(AFTER)
    for i in range(rounds):
        order = [("before", BEFORE), ("after", AFTER)]
        for name, policy in order if i % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            program(policy)
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["before"]), statistics.median(times["after"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60, help="runs of each (default 60)")
    args = parser.parse_args()
    probe = run_python("", policy=AFTER)
    if not probe.ok:
        print(f"strict isolation is not available here: {probe.error}", file=sys.stderr)
        return 2
    worst = 0.0
    for name, program in (("hello program", hello), ("code-improve test run", tests)):
        before, after = measure(program, args.rounds)
        ratio = after / before
        worst = max(worst, ratio)
        print(
            f"{name:<22} before {before * 1000:6.1f} ms   after {after * 1000:6.1f} ms   "
            f"ratio {ratio:.2f}x   (median of {args.rounds})"
        )
    verdict = "within" if worst <= TARGET else "OVER"
    print(f"worst ratio {worst:.2f}x: {verdict} the {TARGET:.2f}x target")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
