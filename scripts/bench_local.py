#!/usr/bin/env python3
"""Local-model batching benchmark: completion tokens per second by --concurrency, in one run.

1. Whole process: ``refine run code-improve`` on the 16 coding requests of
   ``scripts/data/bench_local.jsonl`` with ``--local --max-iters 0`` (generation only) at
   each concurrency, timed from start to exit (server start included). ``--concurrency N``
   gives the server ``min(N, DEFAULT_SLOTS)`` slots, so for this table the default is
   raised to the largest level. Tokens per second = completion tokens / wall time; the
   ratio is to concurrency 1 in the same run. Quality is the same job's answers judged
   the same way at every level: the share whose code block parses and defines a
   function or class, and the mean answer length. Each level runs ``--rounds`` times, in
   alternating order; the best run counts (the least disturbed on a shared machine).
   ``--repeat N`` sends each request N times (ids ``word-count~2``, ...): 16 requests
   keep a large server's higher levels waiting on the longest answer.
2. ``--tune``: the server alone (no refine around it) at 4 slots, varying threads, busy
   polling and the batch size, to see whether the defaults leave speed on the table.
3. ``--layouts``: records per hour of full Self-Refine (``--max-iters`` refinements, which
   the critic cannot cut short: ``--min-iters`` is the same; a refinement identical to its
   input still ends its loop) on the first ``--records`` records, once with the
   pipeline's conversation layout (each call extends the previous call's messages, so the
   server's prompt cache serves a record's history) and once with the layout before it,
   emulated here by rewriting each call's messages as they go out: one user turn opening
   with the role's instruction, the record's material after it, so the calls of a record
   share only the system message. The same model, records, server settings and loop; a
   fresh server for each run (its start not timed). ``--max-tokens`` caps every call
   (repair is off, so a cut answer is not asked again). Prints both rates and their ratio.
   The layouts can change what the model writes, and so how many calls a loop makes:
   ``--replay`` then sends the conversation run's calls again in each layout on a fresh
   server, every answer as long as it was (``ignore_eos``), the same work in both.

The default slot count is the smallest level within 5% of the best tokens per second.

Usage: scripts/bench_local.py [--levels 1,2,4,8] [--rounds 2] [--repeat 1] [--model NAME]
                              [--tune]
       scripts/bench_local.py --layouts [--records 16] [--max-iters 2] [--max-tokens N]
                              [--concurrency 4] [--rounds 1] [--model NAME] [--replay]
                              [--work DIR]
Run it under ``flock /tmp/refine-heavy.lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import Settings, arun, load_job  # noqa: E402
from pipeline.backends.realtime import RealTimeBackend  # noqa: E402
from pipeline.client.chat import OpenAIClient  # noqa: E402
from pipeline.client.limits import Limiter  # noqa: E402
from pipeline.client.models import ModelId  # noqa: E402
from pipeline.core.extraction import extract_code  # noqa: E402
from pipeline.core.prompts import opening  # noqa: E402
from pipeline.core.steps import Completion, ModelClient, Request, Step  # noqa: E402
from pipeline.core.trace import steps_of  # noqa: E402
from pipeline.io.records import read_records  # noqa: E402
from pipeline.sandbox import syntax_problem  # noqa: E402
from pipeline.serving import (  # noqa: E402
    DEFAULT_SLOTS,
    LocalServer,
    resolve_model,
    slots_for,
)
from pipeline.serving.server import SLOTS_ENV  # noqa: E402

RECORDS = ROOT / "scripts" / "data" / "bench_local.jsonl"
NEAR_BEST = 0.95


@dataclass(frozen=True, slots=True)
class Level:
    """One whole-process run at one concurrency."""

    concurrency: int
    wall_s: float
    completion_tokens: int
    answers: int
    done: int
    parses: int

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens per second of wall time."""
        return self.completion_tokens / self.wall_s


def defines_code(answer: str) -> bool:
    """The answer's code block parses and defines at least one function or class."""
    code = extract_code(answer)
    if syntax_problem(code) is not None:
        return False
    tree = ast.parse(code)
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return any(isinstance(node, definitions) for node in ast.walk(tree))


def repeated(records: Path, times: int, dest: Path) -> Path:
    """``records`` with each line ``times`` over in ``dest`` (the copies' ids end in ``~2``,
    ``~3``, ...: ids stay unique); ``records`` itself when ``times`` is 1."""
    if times == 1:
        return records
    rows = [orjson.loads(line) for line in records.read_bytes().splitlines() if line.strip()]
    with dest.open("wb") as handle:
        for copy in range(1, times + 1):
            for row in rows:
                named = row if copy == 1 else {**row, "id": f"{row['id']}~{copy}"}
                handle.write(orjson.dumps(named) + b"\n")
    return dest


def run_level(
    concurrency: int, model: str | None, work: Path, slots: int, records: Path = RECORDS
) -> Level:
    """``refine run`` at one concurrency, timed as a whole process."""
    out = work / f"c{concurrency}"
    command = [
        sys.executable, "-m", "pipeline.cli", "run", "code-improve", str(records),
        "--out", str(out), "--local", "--max-iters", "0",
        "--concurrency", str(concurrency), "--quiet",
    ]  # fmt: skip
    if model:
        command += ["--local-model", model]
    env = {**os.environ, SLOTS_ENV: str(slots)}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        sys.exit(f"refine run exited with {done.returncode} at concurrency {concurrency}")
    rows = [orjson.loads(line) for line in (out / "outputs.jsonl").read_bytes().splitlines()]
    return Level(
        concurrency=concurrency,
        wall_s=wall,
        completion_tokens=sum(int(row["usage"]["completion_tokens"]) for row in rows),
        answers=len(rows),
        done=sum(row["status"] == "done" for row in rows),
        parses=sum(bool(row["output"]) and defines_code(str(row["output"])) for row in rows),
    )


def pick_slots(levels: list[Level]) -> int:
    """The smallest concurrency within 5% of the best tokens per second."""
    best = max(level.tokens_per_s for level in levels)
    return min(level.concurrency for level in levels if level.tokens_per_s >= NEAR_BEST * best)


async def serve_once(model_name: str | None, slots: int, **server: object) -> float:
    """Tokens per second of the server alone: the 16 requests, ``slots`` at a time."""
    from openai import AsyncOpenAI

    job = load_job("code-improve")
    records = [r for r in read_records(RECORDS, job.inputs, "id") if not isinstance(r, Exception)]
    model = await anyio.to_thread.run_sync(resolve_model, model_name)
    tokens = 0
    async with LocalServer(model, parallel=slots, **server) as running:  # type: ignore[arg-type]
        client = AsyncOpenAI(base_url=running.base_url, api_key="local", timeout=900)
        limit = anyio.Semaphore(slots)

        async def one(messages: list[dict[str, str]]) -> None:
            nonlocal tokens
            async with limit:
                reply = await client.chat.completions.create(
                    model=running.model,
                    messages=messages,  # type: ignore[arg-type]
                    temperature=job.temperature,
                    max_tokens=job.max_tokens,
                )
            tokens += reply.usage.completion_tokens if reply.usage else 0

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for record in records:
                tg.start_soon(one, opening(job, record))
        wall = time.perf_counter() - started
        await client.close()
    return tokens / wall


LAYOUTS = ("conversation", "old")
LABELS = {"user": "Request", "assistant": "Reply"}


def old_layout(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """A call's messages as the layout before conversations had them: the system message,
    then one user turn that opens with the role's instruction (the conversation's last
    turn) and shows the record's material (its earlier turns) after it. A generate call,
    which has no material yet, is the same in both layouts."""
    system = [dict(m) for m in messages[:1] if m["role"] == "system"]
    turns = list(messages[len(system) :])
    if len(turns) <= 1:
        return [*system, *[dict(m) for m in turns]]
    *material, request = turns
    shown = "\n\n".join(
        f"## {LABELS.get(m['role'], m['role'])} {i // 2 + 1}\n{m['content']}"
        for i, m in enumerate(material)
    )
    content = f"{request['content']}\n\n# The task and the work so far\n\n{shown}"
    return [*system, {"role": "user", "content": content}]


class OldLayout(ModelClient):
    """A model client that sends every call in the old layout (``old_layout``)."""

    def __init__(self, inner: ModelClient) -> None:
        self.inner = inner

    @property
    def model(self) -> str:
        """The wrapped client's model."""
        return self.inner.model

    async def complete(self, request: Request) -> Completion:
        """The wrapped client's answer to the call rewritten in the old layout."""
        return await self.inner.complete(
            replace(request, messages=tuple(old_layout(request.messages)))
        )


@dataclass(frozen=True, slots=True)
class LayoutRun:
    """One Self-Refine run of the records in one layout."""

    layout: str
    wall_s: float
    records: int
    done: int
    calls: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    stops: str  # why the records' loops stopped, counted: "max_iters 3, no_change 1"
    run_dir: Path

    @property
    def per_hour(self) -> float:
        """Records finished per hour of wall time."""
        return self.records / self.wall_s * 3600

    @property
    def computed(self) -> int:
        """Prompt tokens the server had to compute (not served from its cache)."""
        return self.prompt_tokens - self.cached_tokens


async def run_layout(
    layout: str, model_name: str | None, records: Path, work: Path, args: argparse.Namespace
) -> LayoutRun:
    """Self-Refine over ``records`` on a fresh local server, every call in ``layout``."""
    job = load_job("code-improve")
    if args.max_tokens:
        job = replace(job, max_tokens=args.max_tokens)
    model = await anyio.to_thread.run_sync(resolve_model, model_name)
    async with LocalServer(model, parallel=slots_for(args.concurrency)) as server:
        client = OpenAIClient(
            model=str(ModelId.local(server.model)),
            request_model=server.model,
            base_url=server.base_url,
            api_key="local",
            timeout=3600,
            max_retries=2,
            limiter=Limiter(),
            concurrency=args.concurrency,
            structured=server.structured,
            grammar=server.grammar,
            max_in_flight=server.parallel,
        )
        settings = Settings(
            model=server.model,
            base_url=server.base_url,
            max_iters=args.max_iters,
            min_iters=args.max_iters,  # the critic stops no loop early, in either layout
            concurrency=args.concurrency,
            repair=False,
        )
        used: ModelClient = client if layout == "conversation" else OldLayout(client)
        out = (args.work or work.parent) / f"{work.name}-{layout}"
        started = time.perf_counter()
        try:
            backend = RealTimeBackend(used)
            await arun(job, records, out, settings, backend=backend, show_progress=False)
        finally:
            wall = time.perf_counter() - started
            await client.aclose()
    rows = [orjson.loads(line) for line in (out / "outputs.jsonl").read_bytes().splitlines()]
    usage = [row["usage"] for row in rows]
    return LayoutRun(
        layout=layout,
        wall_s=wall,
        records=len(rows),
        done=sum(row["status"] == "done" for row in rows),
        calls=sum(int(u["calls"]) for u in usage),
        prompt_tokens=sum(int(u["prompt_tokens"]) for u in usage),
        cached_tokens=sum(int(u["cached_tokens"]) for u in usage),
        completion_tokens=sum(int(u["completion_tokens"]) for u in usage),
        run_dir=out,
        stops=", ".join(
            f"{why} {n}" for why, n in sorted(Counter(str(r["stop_reason"]) for r in rows).items())
        ),
    )


def first_records(count: int, dest: Path) -> Path:
    """The first ``count`` records of the benchmark's input, in ``dest``."""
    lines = [line for line in RECORDS.read_bytes().splitlines() if line.strip()][:count]
    dest.write_bytes(b"\n".join(lines) + b"\n")
    return dest


async def replay(layout: str, model_name: str | None, traces: Path, concurrency: int) -> float:
    """Seconds to send the calls of ``traces`` again in ``layout`` on a fresh server: each
    record's calls in order, the records side by side, every answer exactly as long as it
    was (``ignore_eos``), so both layouts do the same work and differ only in the prompt."""
    from openai import AsyncOpenAI

    records = [steps_of(orjson.loads(line)["steps"]) for line in traces.read_bytes().splitlines()]
    model = await anyio.to_thread.run_sync(resolve_model, model_name)
    async with LocalServer(model, parallel=slots_for(concurrency)) as server:
        client = AsyncOpenAI(base_url=server.base_url, api_key="local", timeout=3600)
        limit = anyio.Semaphore(server.parallel)

        async def one(steps: list[Step]) -> None:
            for step in (s for s in steps if s.response is not None):  # answered ones
                sent = step.messages if layout == "conversation" else old_layout(step.messages)
                async with limit:
                    await client.chat.completions.create(
                        model=server.model,
                        messages=sent,  # type: ignore[arg-type]  # plain dicts, not its TypedDicts
                        max_tokens=max(1, int(step.usage.get("completion_tokens", 1))),
                        temperature=0,
                        extra_body={"ignore_eos": True},
                    )

        started = time.perf_counter()
        try:
            async with anyio.create_task_group() as tg:
                for steps in records:
                    tg.start_soon(one, steps)
        finally:
            await client.close()
        return time.perf_counter() - started


def replay_both(run: LayoutRun, args: argparse.Namespace) -> None:
    """The conversation run's calls sent again in each layout, as much work in both."""
    traces = run.run_dir / "traces.jsonl"
    walls = {}
    for layout in LAYOUTS:
        walls[layout] = anyio.run(replay, layout, args.model, traces, args.concurrency)
        print(
            f"replay of the conversation run's {run.calls} calls, {layout} layout: "
            f"{walls[layout]:.1f} s = {run.records / walls[layout] * 3600:.1f} records/h",
            flush=True,
        )
    print(
        f"replay, conversation / old: {walls['old'] / walls['conversation']:.2f}x records per hour"
    )


def bench_layouts(args: argparse.Namespace) -> None:
    """Records per hour in the conversation layout and in the old one, and their ratio."""
    cores = len(os.sched_getaffinity(0))
    print(
        f"{args.records} coding records, code-improve, {args.max_iters} refinement(s) each, "
        f"max_tokens {args.max_tokens or 'of the job'}, concurrency {args.concurrency} "
        f"({slots_for(args.concurrency)} slots), model {args.model or 'default'}, "
        f"{cores} cores, {args.rounds} round(s)",
        flush=True,
    )
    runs: dict[str, list[LayoutRun]] = {layout: [] for layout in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="bench-layouts-") as tmp:
        records = first_records(args.records, Path(tmp) / "records.jsonl")
        for round_ in range(args.rounds):
            # Alternate the order so a slow spell on a shared machine hits both layouts.
            for layout in LAYOUTS if round_ % 2 == 0 else LAYOUTS[::-1]:
                work = Path(tmp) / f"r{round_}"
                run = anyio.run(run_layout, layout, args.model, records, work, args)
                runs[layout].append(run)
                print(
                    f"round {round_ + 1}, {layout} layout: {run.records} records "
                    f"({run.done} done) in {run.wall_s:.1f} s = {run.per_hour:.1f} records/h; "
                    f"{run.calls} calls, prompt tokens {run.prompt_tokens} of which cached "
                    f"{run.cached_tokens} (computed {run.computed}), completion tokens "
                    f"{run.completion_tokens}; stopped: {run.stops}",
                    flush=True,
                )
        best = {layout: max(runs[layout], key=lambda run: run.per_hour) for layout in LAYOUTS}
        if args.replay:
            replay_both(best["conversation"], args)
    print()
    print(
        "| layout | records/h | s/call | calls | prompt tokens | cached | computed | completion |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for layout in LAYOUTS:
        run = best[layout]
        print(
            f"| {layout} | {run.per_hour:.1f} | {run.wall_s / max(run.calls, 1):.2f} | "
            f"{run.calls} | {run.prompt_tokens} | {run.cached_tokens} | {run.computed} | "
            f"{run.completion_tokens} |"
        )
    new, old = best["conversation"], best["old"]
    print(f"\nconversation / old: {new.per_hour / old.per_hour:.2f}x records per hour")
    if new.calls != old.calls:
        # The layouts can change what the model writes, and so when a loop stops.
        per_call = (old.wall_s / max(old.calls, 1)) / (new.wall_s / max(new.calls, 1))
        print(
            f"the layouts made different calls ({new.calls} and {old.calls}); per call, the "
            f"conversation layout was {per_call:.2f}x as fast"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", default="1,2,4,8", help="concurrency levels, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="runs per level (best one counts)")
    parser.add_argument("--repeat", type=int, default=1, help="send each request N times")
    parser.add_argument("--model", default=None, help="--local-model (default: the default)")
    parser.add_argument("--tune", action="store_true", help="also vary threads, polling, batch")
    parser.add_argument(
        "--layouts", action="store_true", help="records/h: conversation layout against the old"
    )
    parser.add_argument("--records", type=int, default=16, help="--layouts: the first N records")
    parser.add_argument("--max-iters", type=int, default=2, help="--layouts: refinements")
    parser.add_argument("--max-tokens", type=int, default=None, help="--layouts: cap per call")
    parser.add_argument(
        "--concurrency", type=int, default=DEFAULT_SLOTS, help="--layouts: records in flight"
    )
    parser.add_argument("--work", type=Path, default=None, help="--layouts: keep the runs here")
    parser.add_argument(
        "--replay", action="store_true", help="--layouts: also resend the same calls in each"
    )
    args = parser.parse_args()
    if args.layouts:
        if args.rounds == parser.get_default("rounds"):
            args.rounds = 1
        bench_layouts(args)
        return
    levels = [int(x) for x in args.levels.split(",")]
    if args.repeat < 1:
        parser.error("--repeat must be 1 or more")
    cores = len(os.sched_getaffinity(0))
    requests = len(RECORDS.read_text().splitlines()) * args.repeat
    print(
        f"{requests} coding requests, generation only, model {args.model or 'default'}, "
        f"{cores} cores, {args.rounds} rounds",
        flush=True,
    )
    runs: dict[int, list[Level]] = {level: [] for level in levels}
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        records = repeated(RECORDS, args.repeat, Path(tmp) / "records.jsonl")
        for round_ in range(args.rounds):
            # Alternate the order so a slow spell on a shared machine hits every level.
            for concurrency in levels if round_ % 2 == 0 else levels[::-1]:
                work = Path(tmp) / f"r{round_}"
                level = run_level(concurrency, args.model, work, max(levels), records)
                runs[concurrency].append(level)
                print(
                    f"round {round_ + 1}, concurrency {concurrency}: {level.completion_tokens} "
                    f"completion tokens in {level.wall_s:.1f} s = {level.tokens_per_s:.1f} tok/s; "
                    f"code that parses {level.parses}/{level.answers}",
                    flush=True,
                )
    best = [max(runs[level], key=lambda run: run.tokens_per_s) for level in levels]
    base = best[0]
    print()
    print("| concurrency | tok/s (best run) | vs 1 | code parses (all runs) | mean tokens |")
    print("| --- | --- | --- | --- | --- |")
    for level in best:
        every = runs[level.concurrency]
        answers = sum(run.answers for run in every)
        print(
            f"| {level.concurrency} | {level.tokens_per_s:.1f} | "
            f"{level.tokens_per_s / base.tokens_per_s:.2f}x | "
            f"{sum(run.parses for run in every)}/{answers} | "
            f"{sum(run.completion_tokens for run in every) / max(answers, 1):.0f} |"
        )
    print(
        f"\ndefault slots: {pick_slots(best)} (smallest level within 5% of the best; "
        f"pipeline.serving.DEFAULT_SLOTS is {DEFAULT_SLOTS})"
    )
    if args.tune:
        variants: list[tuple[str, dict[str, object]]] = [
            (f"{cores} threads (default)", {}),
            (f"{max(cores - 1, 1)} thread(s)", {"n_threads": max(cores - 1, 1)}),
            ("no busy polling (--poll 0)", {"extra_args": ("--poll", "0")}),
            ("batch 64 (--batch-size, --ubatch-size)", {"batch_size": 64}),
        ]
        print(f"\nserver alone, 4 slots, 16 requests, best of {args.rounds}:")
        for label, server in variants:
            rate = max(
                anyio.run(functools.partial(serve_once, args.model, 4, **server))
                for _ in range(args.rounds)
            )
            print(f"  {label}: {rate:.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
